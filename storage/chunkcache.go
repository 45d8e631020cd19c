package storage

import (
	"container/list"
	"sync"
)

// fieldView is one field of one chunk, decoded: its units back to back,
// unit i at raw[offs[i]:offs[i+1]] stored in mode modes[i]. Views are never
// changed once made, so readers share them without locks.
type fieldView struct {
	modes []byte
	offs  []int
	raw   []byte
}

func (v *fieldView) unit(i int) (byte, []byte) {
	return v.modes[i], v.raw[v.offs[i]:v.offs[i+1]]
}

type cacheKey struct {
	id    uint64
	field int
}

// chunkCache keeps recently decoded chunk fields, least recently used out
// first, within a byte budget. Slice sampling reads neighbouring rows, so a
// chunk decoded for one row usually serves the rest of its slice.
type chunkCache struct {
	mu      sync.Mutex
	max     int64
	size    int64
	order   *list.List // front: most recently used; values are *cacheEntry
	entries map[cacheKey]*list.Element
	hits    int64
	misses  int64
}

type cacheEntry struct {
	key  cacheKey
	view *fieldView
	size int64
}

func newChunkCache(maxBytes int64) *chunkCache {
	return &chunkCache{max: maxBytes, order: list.New(), entries: map[cacheKey]*list.Element{}}
}

func (c *chunkCache) get(k cacheKey) *fieldView {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[k]; ok {
		c.order.MoveToFront(e)
		c.hits++
		return e.Value.(*cacheEntry).view
	}
	c.misses++
	return nil
}

// has reports whether k is cached, without counting a lookup.
func (c *chunkCache) has(k cacheKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.entries[k]
	return ok
}

func (c *chunkCache) put(k cacheKey, v *fieldView) {
	size := int64(len(v.raw) + len(v.modes) + 8*len(v.offs) + 64)
	if size > c.max {
		return // larger than the whole budget: decode it every time
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; ok {
		return // another reader decoded it meanwhile
	}
	c.entries[k] = c.order.PushFront(&cacheEntry{key: k, view: v, size: size})
	c.size += size
	for c.size > c.max {
		e := c.order.Back()
		ce := e.Value.(*cacheEntry)
		c.order.Remove(e)
		delete(c.entries, ce.key)
		c.size -= ce.size
	}
}

// CacheStats counts decoded-chunk cache lookups.
type CacheStats struct {
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	Bytes  int64 `json:"bytes"`
}

func (c *chunkCache) stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Hits: c.hits, Misses: c.misses, Bytes: c.size}
}
