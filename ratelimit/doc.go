// Package ratelimit decides when actors may insert rows and learners may
// sample them, so that each row is replayed about SamplesPerInsert times:
// the flow control of a replay service (Reverb's SampleToInsertRatio, with
// the changes listed in rbd's design: every wait has a deadline, the state
// is visible, and counters restart at the window's centre).
//
// The arithmetic, with spi = SamplesPerInsert:
//
//	diff     = spi*inserts - samples
//	min_diff = spi*min_size - error_buffer
//	max_diff = spi*min_size + error_buffer
//
// A sample of n rows is admitted iff size >= min_size and
// diff - n >= min_diff. An insert of n rows is admitted iff
// inserts + n <= min_size (the buffer is still filling) or
// diff + spi*n <= max_diff. Without a ratio (SamplesPerInsert 0) only the
// size rule holds. Admission and the counter update happen under one lock;
// a request that fails afterwards gives its rows back (Grant.Refund), so a
// failed request counts nothing.
//
// Callers that cannot be admitted wait in one first-come-first-served
// queue per side, each until its own deadline, its context or a stop
// channel ends the wait; a waiter that leaves counts nothing. Nothing
// waits without a deadline.
//
// The package knows nothing of buffers: the storage layer owns one Limiter
// per buffer, reports the buffer's size after each write, and counts rows.
package ratelimit
