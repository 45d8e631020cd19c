// Package client is a typed Go client for rbd's HTTP API (v1): it creates,
// inspects and deletes buffers, extends them with rows, samples batches,
// updates priorities, reads rows, closes streams and sets the weights of a
// server-run collector. Tensors travel as safetensors (codec), control
// bodies and answers as JSON; the contract is docs/http-api.md.
//
// The package depends on the standard library, rbd's codec and ratelimit
// types and, for shared-memory streams, mmap-go, so a remote actor or
// learner that imports it does not pull in the store (bbolt). The types that mirror the server's JSON (Info, Spec,
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
// Batch is referenced. Batches of a shared-memory stream
// (StreamOptions.SharedMemory) are the exception: their tensors alias a
// slot the server filled, until Batch.Release hands it back. Extend and
// SetWeights stream the tensors' Data
// straight into the request without assembling the body; the caller must
// not modify Data until the call returns.
//
// # Streams
//
// SampleStream opens one request that answers many batches (docs/http-api.md,
// "Sample streams"): the server draws StreamOptions.Depth batches ahead and
// TCP paces it, so a learner pays no round trip per batch. With
// StreamOptions.SharedMemory, a client on the server's machine gets the
// batches in a shared-memory arena instead of over the socket
// (ErrNotColocated where that cannot work).
package client
