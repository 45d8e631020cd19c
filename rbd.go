package rbd

import (
	"github.com/rbdb/rbd/storage"
)

// Options configures Open; nil gives the defaults documented on
// storage.Options.
type Options = storage.Options

// DB is an open data dir.
type DB struct {
	*storage.Store
}

// Open opens (creating if needed) the data dir at dir and recovers its
// buffers.
func Open(dir string, opts *Options) (*DB, error) {
	s, err := storage.Open(dir, opts)
	if err != nil {
		return nil, err
	}
	return &DB{Store: s}, nil
}
