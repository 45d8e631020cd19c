package rbd

import (
	"math/bits"
	"sync"
)

// bytePool recycles sample result memory by power-of-two size class, so a
// learner sampling the same shape over and over stops allocating (and
// zeroing) megabytes per batch.
type bytePool struct {
	classes [48]sync.Pool
	// batches recycles released Batch values with their tensor, shape
	// and buffer lists.
	batches sync.Pool
}

// batch returns an empty Batch that hands its memory back to p.
func (p *bytePool) batch() *Batch {
	b, _ := p.batches.Get().(*Batch)
	if b == nil {
		b = &Batch{}
	}
	b.pool = p
	return b
}

func sizeClass(n int) int {
	if n <= 64 {
		return 6
	}
	return bits.Len(uint(n - 1))
}

// get returns a buffer of length n whose contents are arbitrary. The
// pointer goes back to put as it came: a pool of *[]byte recycles the
// slice header too, so a steady sampler allocates nothing here.
func (p *bytePool) get(n int) *[]byte {
	c := sizeClass(n)
	if c >= len(p.classes) {
		b := make([]byte, n)
		return &b
	}
	if v := p.classes[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<c)
	return &b
}

func (p *bytePool) put(b *[]byte) {
	c := sizeClass(cap(*b))
	if cap(*b) != 1<<c || c >= len(p.classes) {
		return // not one of ours
	}
	*b = (*b)[:cap(*b)]
	p.classes[c].Put(b)
}

// pooledBytes is the memory the pool hands out for a request of n bytes.
func pooledBytes(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return 1 << sizeClass(int(n))
}
