// Package logbuf batches log lines on their way to a file or pipe.
//
// `rbd serve` writes one line per request. Written as it comes, each line
// is a system call of its own, and at thousands of sample requests a
// second those calls cost more than a request's own work on a small
// machine (7 µs of a 63 µs CartPole sample, measured with
// BenchmarkHTTPSample and a JSON request log). A Writer keeps lines in
// memory and writes them together: when Interval has passed since the
// oldest unwritten line, when MaxPending bytes are waiting, on Flush and
// on Close.
//
// Lines that matter at once (start-up, warnings, errors) go through
// Writer.Immediate, which writes them together with everything waiting
// before them, so the output keeps the order in which lines were logged.
// What a crash loses is at most Interval of request lines, never an
// operational event.
package logbuf
