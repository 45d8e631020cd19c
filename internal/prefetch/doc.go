// Package prefetch asks the CPU to bring cache lines in ahead of the reads
// that need them: Line runs the CPU's prefetch instruction (PREFETCHT0 on
// amd64, PRFM PLDL1KEEP on arm64) and returns at once, so a loop can have
// dozens of cache misses in flight while it goes on computing, where a
// load would hold up what comes after it until its line arrives.
//
// Go has no prefetch in its language or standard library outside the
// runtime, so Line is a few lines of assembly; on other CPUs it is a load.
// A call costs a few nanoseconds: callers prefetch where a miss is likely
// and the work between the prefetch and the read is worth it (a sample's
// rows at random places in a large ring, a batch of tree descents), not on
// data that is likely in cache. Slots prefetches a whole list of rows of
// one region in a single call, the loop in assembly too: for a column's
// 256 rows it costs two fifths of 256 calls of Line (BenchmarkSlots). A
// prefetch never faults.
package prefetch
