// Package rbd is the embeddable replay-buffer database: it opens a data dir
// and gives access to its buffers (see package storage for the model).
//
//	db, err := rbd.Open("./rbd-data", nil)
//	...
//	defer db.Close()
//	buf, _, err := db.CreateBuffer("cartpole", spec)
//	res, err := buf.Extend("actor-0", batch)
package rbd
