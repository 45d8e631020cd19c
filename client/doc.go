// Package client is a typed Go client for rbd's HTTP API (v1): it creates,
// inspects and deletes buffers, extends them with rows, samples batches,
// updates priorities, reads rows, closes streams and sets the weights of a
// server-run collector. Tensors travel as safetensors (codec), control
// bodies and answers as JSON; the contract is docs/http-api.md.
//
// The package depends only on the standard library and rbd's codec, so a
// remote actor or learner that imports it does not pull in the store
// (bbolt, mmap). The types that mirror the server's JSON (Info, Spec,
// ExtendResult, SampleRequest) are declared here for that reason; they
// carry the same JSON names as their counterparts in packages rbd and
// storage.
//
// # Errors
//
// An answer with a status outside 2xx is returned as an *APIError holding
// the status, the server's machine code (e.g. "not_ready") and its message,
// wrapped with the operation. errors.Is matches it against ErrBadRequest,
// ErrUnauthorized, ErrNotFound, ErrConflict, ErrTooLarge, ErrNotReady,
// ErrContention and ErrShuttingDown; IsNotFound and IsNotReady are shorthands, and RetryAfter
// reads the server's Retry-After hint. Transport failures and cancelled
// contexts come back as returned by net/http (errors.Is(err,
// context.DeadlineExceeded) works).
//
// # Concurrency
//
// A Client is safe for concurrent use by many goroutines and reuses
// connections: every answer body is read to its end before it is closed.
// The default transport keeps up to 64 idle connections per host, so
// concurrent writers and samplers do not keep dialling anew.
//
// # Memory
//
// Sample and Rows read the answer into one buffer and decode it in place:
// the tensors of a Batch alias that buffer (no copy per tensor). The Batch
// owns it; nothing else writes to it, so it stays valid as long as the
// Batch is referenced. Extend and SetWeights stream the tensors' Data
// straight into the request without assembling the body; the caller must
// not modify Data until the call returns.
package client
