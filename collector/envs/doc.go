// Package envs holds rbd's built-in environments: real dynamics, seeded and
// deterministic, used by the embedded collectors, the demo server and the
// benchmarks (never canned data).
package envs
