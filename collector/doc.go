// Package collector runs environments in-process and writes their steps
// into a replay buffer: TorchRL-style collectors for rbd.
//
// A run (Run with a Config) steps a batched Env (envs.Env: NumEnvs copies,
// seeded), asks a Policy for each tick's actions, stages the rows column by
// column in buffers it allocates once and reuses, and hands each batch of
// FramesPerBatch frames to a Writer: an in-process buffer (BufferWriter) or
// an rbd server (HTTPWriter), with the same rollout code for both.
//
// Rows follow TorchRL's layout (observation, action, next.reward,
// next.done, next.terminated, next.truncated, next.observation; see
// BufferSpec). Rows are tick-major: row t*NumEnvs+e is copy e's step t, and
// each row names its copy as its env, so the store allocates trajectory
// ids per (stream, env). With CompactObs, next.observation travels only on
// done rows, as the final observation of the trajectory.
//
// Policies: RandomPolicy, LinearQ and MLPQ (epsilon-greedy over a linear or
// one-hidden-layer Q-function) and GRUQ (a GRU Q-function, a
// RecurrentPolicy); all but the first are WeightSetters whose weights may be
// replaced while a run uses them. A RecurrentPolicy's hidden states are
// owned by the run: stored with each row (the state before the step, field
// recurrent_state), zero where a trajectory starts and carried otherwise,
// across batches too (docs/recurrent.md).
//
// docs/collector-internals.md describes the per-step flow, staging, and
// when writes, resets and weight syncs happen.
package collector
