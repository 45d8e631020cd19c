// Package storage is rbd's trajectory store: named buffers, each a ring of
// fixed capacity whose rows carry a global write sequence number (seq),
// trajectory ids and links to the previous and next step of the same
// trajectory.
//
// # Model
//
// Every written row gets seq 0, 1, 2, ... never reused; it lives in slot
// seq % slots (the ring's slots: its capacity, or more with a spare block,
// ringSlotCount) and is live while write_count - capacity <= seq <
// write_count and its slot still holds it. Writers name a stream and each
// row an env; the rows of one (stream, env) form trajectories in time order,
// a done row ends one. Trajectories of many envs interleave freely in the
// ring: they are followed through their links, never slot adjacency. The
// trajectory index (live trajectories and their live rows) is kept up to
// date on every write, so samplers draw in O(batch) whatever the store size.
//
// In compact_obs buffers writers drop next.<k> for the observation keys and
// send the final observation on done rows only; it is kept in a tail store
// so next-state reconstruction is exact at every trajectory end.
//
// # Storage kinds
//
// KindMemory keeps rows in anonymous memory (lost on restart; spec and
// counters survive in the catalog). KindMemmap keeps one memory-mapped file
// per field plus a row-metadata file, documented in docs/format.md, and
// survives restarts and crashes.
//
// # Durability and recovery
//
// A row is written field bytes first and its metadata record last, with
// CRC-32C checksums over both; recovery accepts a row only when both hold,
// so after a crash every row is either whole or absent. DurabilityFsync
// acknowledges an extend after its rows are synced (concurrent extends share
// one sync); DurabilityFlush syncs at every checkpoint (Options
// .CheckpointInterval) and on close; DurabilityNone on close only. Each
// buffer keeps a durable watermark: damage below it is an error, a torn
// tail above it is what a crash leaves.
//
// # Concurrency
//
// A Buffer allows many concurrent writers and readers. Writers are
// serialised per buffer (the ring is one sequence); readers copy rows
// without locks, checking a per-slot stamp before and after each row, so a
// row is returned whole or reported missing, never torn.
//
// # Caveats
//
// Column bytes are memory-mapped. Store.Close and Store.DeleteBuffer wait
// for calls in flight before unmapping; nothing returned by this package
// aliases the mapping.
package storage
