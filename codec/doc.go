// Package codec encodes and decodes tensors on the wire: safetensors (the
// binary format of sample answers and extend bodies) and JSON tensors (for
// people and debugging). It is shared by the server and the clients and
// depends on nothing else of rbd.
//
// Every decoder here reads bytes from outside the process, so none trusts
// them: header sizes are capped, offsets must tile the data exactly, and
// shapes must match byte counts. Decoded tensors alias the input buffer
// (no copy).
package codec
