// Package sampler chooses rows: which seqs a batch holds, with importance
// weights and slice masks. It never touches field bytes — the storage
// package gathers them and package transforms derives next observations and
// n-step returns — so every sampler works the same on every storage kind.
//
// Samplers run inside storage.Buffer.ReadIndex, against the trajectory index
// kept up to date on every write, so a draw costs O(batch) (O(batch log n)
// for prioritised kinds) whatever the number of stored rows.
//
// Kinds (the "sampler" of a sample request):
//
//   - uniform: live rows with replacement.
//   - without_replacement: an epoch per consumer over the ring's slots;
//     the last batch of an epoch is short unless DropLast.
//   - prioritized: P(i) = q_i / sum q, q = (p + eps)^alpha, importance
//     weight (q_i / q_min)^-beta with q_min over all live rows.
//   - slice: [num_slices, slice_len] runs of consecutive rows of one
//     trajectory; trajectories uniform among those long enough, start
//     uniform among valid starts; padded with a mask when not strict.
//   - slice_without_replacement: an epoch over trajectories per consumer.
//   - prioritized_slice: slice starts drawn by row priority.
//
// All draws come from the *rand.Rand passed in, so a seeded request is
// reproducible for the same store state.
package sampler
