//go:build race

package server_test

// raceEnabled: the race detector's sync.Pool drops items on purpose, so
// allocation counts are only meaningful without it.
const raceEnabled = true
