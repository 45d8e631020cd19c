// Package perm provides lazily evaluated pseudo-random permutations for
// without-replacement sampling epochs.
//
// An epoch over a 10^7-row buffer visits every row exactly once in a shuffled
// order. Materialising that order with rand.Perm costs 80 MB and a full
// O(n) shuffle at the start of every epoch, and the slice has to be kept alive
// (and checkpointed) for the whole epoch. A Perm instead computes the i-th
// element on demand from (n, seed) alone, in O(1) memory, so an epoch's
// position is just a counter and resuming one needs only (n, seed, i).
//
// The permutation is a balanced Feistel network over the smallest power-of-two
// domain with an even number of bits that covers n, restricted to [0, n) by
// cycle walking. Epochs of at most 16 rows, where a Feistel network is too
// narrow to mix well, use a Fisher-Yates table stored inside the value instead.
// Perm is meant for statistical shuffling, not cryptography: its orders are
// not uniform over all n! permutations, but individual positions and pairs are
// indistinguishable from uniform in the tests.
package perm
