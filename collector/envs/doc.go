// Package envs holds rbd's built-in environments: real dynamics, seeded and
// deterministic, used by the embedded collectors, the demo server and the
// benchmarks (never canned data).
//
// CartPole (CartPole-v1, and cartpole-masked: the same observing x and theta
// only, for recurrent policies), Pendulum (Pendulum-v1) and Catch (an 84x84
// pixel game with an optional frame stack) each have a typed single-copy
// API.
// Env is the batched interface collectors use; Vector implements it over
// NumEnvs copies, each with its own state and random stream, stepped in the
// caller's goroutine or in parallel goroutines. New builds a Vector of a
// built-in env by name.
package envs
