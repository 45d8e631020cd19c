// Package transforms derives sample-time fields from stored rows: the next
// observation of a compact_obs row (next-state reconstruction) and n-step
// returns. Both follow the trajectory links and tails kept by storage, never
// batch adjacency, so two slices of one trajectory placed side by side in a
// batch cannot leak into each other, and reconstruction is exact at
// terminations and truncations alike.
//
// The functions here plan where each value comes from; they run inside
// storage.Buffer.ReadIndex, and the caller gathers the named rows.
package transforms
