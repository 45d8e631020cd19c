// Package collector runs environments in-process and writes their steps
// straight into a buffer: the rollout loop, policies, and the Writer that is
// either an in-process buffer or an rbd server.
//
// The loop steps every env once per tick, stages rows in time order
// (interleaved by env), and writes one batch per FramesPerBatch frames.
// With CompactObs it drops next.observation and sends the final observation
// on done rows only; trajectory ids come from the store, per (stream, env).
package collector
