package client

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rbdb/rbd/codec"
)

// ShardedOptions configures NewSharded. The zero value gives the defaults.
type ShardedOptions struct {
	// Client configures each shard's client (token, TLS, timeouts).
	Client *Options
	// StatsTTL is how long a buffer's per-shard sizes and priority totals
	// are reused to split batches. Zero means 1 s. Within it, rows written
	// or reprioritised since are not yet reflected in the split (see
	// docs/scale-out.md).
	StatsTTL time.Duration
	// ShardTimeout bounds each shard's part of a sample (a shard that has
	// not answered by then is left out of that draw) and each write
	// attempt (a shard that has not answered by then is passed over, like
	// one that refused). Zero means 5 s.
	ShardTimeout time.Duration
	// DownFor is how long a shard that failed a write is passed over by
	// writes. Zero means 10 s.
	DownFor time.Duration
	// Seed seeds the split of batches across shards; nil draws one.
	Seed *uint64
	// Resolver looks up NewShardedSRV's name; nil means the system's.
	Resolver *net.Resolver
}

func (o *ShardedOptions) withDefaults() ShardedOptions {
	var c ShardedOptions
	if o != nil {
		c = *o
	}
	if c.StatsTTL <= 0 {
		c.StatsTTL = time.Second
	}
	if c.ShardTimeout <= 0 {
		c.ShardTimeout = 5 * time.Second
	}
	if c.DownFor <= 0 {
		c.DownFor = 10 * time.Second
	}
	return c
}

// Sharded is a client of several rbd servers (shards) that makes them
// behave as one buffer: each stream's rows go to one shard chosen by
// rendezvous hashing, and samples are split across shards in proportion
// to what each holds, so that a merged batch is drawn, and weighted, as if
// one buffer held every row. Its methods are safe for concurrent use.
type Sharded struct {
	shards []*shardConn
	opts   ShardedOptions

	mu    sync.Mutex
	rng   *rand.Rand               // the split's randomness, guarded by mu
	stats map[string]*shardedStats // per buffer, guarded by mu
	homes map[streamKey]int        // the shard each stream last wrote to, guarded by mu
	// visited holds the shards each stream has written to, guarded by mu:
	// a stream that comes back to a shard it left closes its old
	// trajectories there first.
	visited map[streamKey]map[int]bool
}

type streamKey struct{ buffer, stream string }

type shardConn struct {
	url string
	c   *Client
	// downUntil (unix nanoseconds) is when writes may try the shard again
	// after it failed one.
	downUntil atomic.Int64
}

// shardedStats is a buffer's per-shard sampling figures at one time.
type shardedStats struct {
	at    time.Time
	infos []*Info // nil where the shard did not answer
}

// ErrNoShards is returned when no shard can take a request: every shard
// failed (writes), or none answered (samples).
var ErrNoShards = errors.New("client: no shard answered")

// NewSharded returns a client of the shards at urls. The list may not be
// empty or name a shard twice; the order does not matter (shards are
// numbered in the sorted order of their URLs, the numbers answers carry as
// "shard").
func NewSharded(urls []string, opts *ShardedOptions) (*Sharded, error) {
	if len(urls) == 0 {
		return nil, errors.New("sharded client: the shard list is empty")
	}
	o := opts.withDefaults()
	sorted := slices.Clone(urls)
	for i, u := range sorted {
		sorted[i] = strings.TrimRight(strings.TrimSpace(u), "/")
	}
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, fmt.Errorf("sharded client: shard %q is listed twice", sorted[i])
		}
	}
	s := &Sharded{opts: o, stats: map[string]*shardedStats{}, homes: map[streamKey]int{}, visited: map[streamKey]map[int]bool{}}
	seed := rand.Uint64()
	if o.Seed != nil {
		seed = *o.Seed
	}
	s.rng = rand.New(rand.NewPCG(seed, 0x5a4d))
	for _, u := range sorted {
		c, err := New(u, o.Client)
		if err != nil {
			return nil, fmt.Errorf("sharded client: shard %q: %w", u, err)
		}
		s.shards = append(s.shards, &shardConn{url: u, c: c})
	}
	return s, nil
}

// NewShardedSRV looks the shards up in DNS: name is an SRV name such as a
// Kubernetes headless Service publishes
// ("_http._tcp.rbd.default.svc.cluster.local"); each target and port
// becomes http://target:port (https when opts.Client names a CAFile).
func NewShardedSRV(ctx context.Context, name string, opts *ShardedOptions) (*Sharded, error) {
	r := net.DefaultResolver
	if opts != nil && opts.Resolver != nil {
		r = opts.Resolver
	}
	_, addrs, err := r.LookupSRV(ctx, "", "", name)
	if err != nil {
		return nil, fmt.Errorf("sharded client: look up SRV %q: %w", name, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("sharded client: SRV %q names no shard", name)
	}
	scheme := "http"
	if opts != nil && opts.Client != nil && opts.Client.CAFile != "" {
		scheme = "https"
	}
	var urls []string
	for _, a := range addrs {
		urls = append(urls, fmt.Sprintf("%s://%s", scheme, net.JoinHostPort(strings.TrimSuffix(a.Target, "."), strconv.Itoa(int(a.Port)))))
	}
	return NewSharded(urls, opts)
}

// Shards returns the shards' URLs, in shard-number order.
func (s *Sharded) Shards() []string {
	out := make([]string, len(s.shards))
	for i, sh := range s.shards {
		out[i] = sh.url
	}
	return out
}

// Shard returns the client of shard i.
func (s *Sharded) Shard(i int) *Client { return s.shards[i].c }

// HashOrder returns the shards in the rendezvous order of stream: a stream
// writes to the first healthy one. Removing a shard moves only the streams
// that had it first; the others keep theirs.
func (s *Sharded) HashOrder(stream string) []int {
	type scored struct {
		i     int
		score uint64
	}
	sc := make([]scored, len(s.shards))
	for i, sh := range s.shards {
		h := fnv.New64a()
		h.Write([]byte(sh.url))
		h.Write([]byte{0})
		h.Write([]byte(stream))
		sc[i] = scored{i, mix64(h.Sum64())}
	}
	slices.SortFunc(sc, func(a, b scored) int { return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.i, b.i)) })
	out := make([]int, len(sc))
	for k, v := range sc {
		out[k] = v.i
	}
	return out
}

// mix64 spreads the bits of an FNV hash (splitmix64's finaliser), so that
// URLs that differ only at their end still get independent scores.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// CreateBuffer creates the buffer on every shard. It first asks every
// shard for the buffer and refuses, before creating anything, when shards
// already hold it with different specs, or with a spec other than spec
// (ErrConflict); a shard that cannot be reached is an error too.
func (s *Sharded) CreateBuffer(ctx context.Context, name string, spec *Spec) ([]Info, error) {
	want, err := spec.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	infos := make([]*Info, len(s.shards))
	errs := s.each(ctx, func(ctx context.Context, i int, c *Client) error {
		info, err := c.Info(ctx, name)
		if IsNotFound(err) {
			return nil
		}
		infos[i] = &info
		return err
	})
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	var first *Info
	for i, info := range infos {
		if info == nil {
			continue
		}
		if first != nil && !sameSpec(first.Spec, info.Spec) {
			return nil, fmt.Errorf("create %s: shards %s and %s hold it with different specs: %w", name, s.shards[slices.Index(infos, first)].url, s.shards[i].url, ErrConflict)
		}
		first = info
	}
	out := make([]Info, len(s.shards))
	errs = s.each(ctx, func(ctx context.Context, i int, c *Client) error {
		info, _, err := c.CreateBufferJSON(ctx, name, want)
		out[i] = info
		return err
	})
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create %s: %w", name, err)
	}
	return out, nil
}

func sameSpec(a, b Spec) bool {
	ja, err1 := a.MarshalJSON()
	jb, err2 := b.MarshalJSON()
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// each runs fn for every shard in parallel and returns the errors by
// shard (each wrapped with the shard's URL; nil for shards that
// succeeded).
func (s *Sharded) each(ctx context.Context, fn func(ctx context.Context, i int, c *Client) error) []error {
	errs := make([]error, len(s.shards))
	var wg sync.WaitGroup
	for i, sh := range s.shards {
		wg.Go(func() {
			if err := fn(ctx, i, sh.c); err != nil {
				errs[i] = fmt.Errorf("shard %d (%s): %w", i, sh.url, err)
			}
		})
	}
	wg.Wait()
	return errs
}

// ShardedExtendResult is the answer to Sharded.Extend: the shard the rows
// went to, and its answer.
type ShardedExtendResult struct {
	Shard int
	ExtendResult
}

// Extend writes rows of stream to its shard: the first healthy one in the
// stream's rendezvous order. If that shard cannot be reached or answers a
// server error, it is passed over for DownFor and the rows go to the next
// one in the order; the stream's open trajectories on the failed shard
// end there, cut, as a stream close would end them: when the stream comes
// back to that shard, the client closes the stream there before it
// writes, so no trajectory joins rows across the time it wrote elsewhere. Errors that are the
// request's (4xx) and flow control (503 rate_limited, busy) come back at
// once: another shard would answer the same.
func (s *Sharded) Extend(ctx context.Context, name, stream string, tensors []codec.Tensor) (ShardedExtendResult, error) {
	return s.ExtendWithOptions(ctx, name, stream, tensors, nil)
}

// ExtendWithOptions is Extend with ExtendOptions (the rate limiter's wait);
// a shard's attempt may then take up to ShardTimeout plus that wait.
func (s *Sharded) ExtendWithOptions(ctx context.Context, name, stream string, tensors []codec.Tensor, opts *ExtendOptions) (ShardedExtendResult, error) {
	attempt := s.opts.ShardTimeout
	if opts != nil && opts.TimeoutMS > 0 {
		attempt += time.Duration(opts.TimeoutMS) * time.Millisecond
	}
	order := s.HashOrder(stream)
	now := time.Now().UnixNano()
	var healthy, down []int
	for _, i := range order {
		if s.shards[i].downUntil.Load() > now {
			down = append(down, i)
		} else {
			healthy = append(healthy, i)
		}
	}
	var errs []error
	// Shards marked down are tried last, so that writes go on (to one of
	// them) when every shard failed once.
	for _, i := range append(healthy, down...) {
		sh := s.shards[i]
		key := streamKey{name, stream}
		s.mu.Lock()
		home, moved := s.homes[key]
		back := moved && home != i && s.visited[key][i]
		s.mu.Unlock()
		actx, cancel := context.WithTimeout(ctx, attempt)
		var err error
		if back {
			// The stream left this shard with trajectories open there;
			// continuing them would join rows across the time it wrote
			// elsewhere. End them first, as a stream close does.
			_, err = sh.c.CloseStream(actx, name, stream)
		}
		var res ExtendResult
		if err == nil {
			res, err = sh.c.ExtendWithOptions(actx, name, stream, tensors, opts)
		}
		cancel()
		if err == nil {
			s.mu.Lock()
			s.homes[key] = i
			if s.visited[key] == nil {
				s.visited[key] = map[int]bool{}
			}
			s.visited[key][i] = true
			s.mu.Unlock()
			return ShardedExtendResult{Shard: i, ExtendResult: res}, nil
		}
		if !shardFailed(err) || ctx.Err() != nil {
			return ShardedExtendResult{Shard: i}, fmt.Errorf("shard %d (%s): %w", i, sh.url, err)
		}
		sh.downUntil.Store(time.Now().Add(s.opts.DownFor).UnixNano())
		errs = append(errs, fmt.Errorf("shard %d (%s): %w", i, sh.url, err))
	}
	return ShardedExtendResult{Shard: -1}, fmt.Errorf("extend %s: %w: %w", name, ErrNoShards, errors.Join(errs...))
}

// shardFailed tells a shard's failure (unreachable, a 5xx other than flow
// control, shutting down) from an answer about the request.
func shardFailed(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return true // transport: refused, reset, timed out
	}
	switch {
	case errors.Is(err, ErrShuttingDown):
		return true
	case ae.Status == http.StatusServiceUnavailable || ae.Status == http.StatusTooManyRequests:
		return false // busy, rate_limited, not_ready: flow control
	case ae.Status >= 500:
		return true
	}
	return false
}

// StreamShard returns the shard stream last wrote buffer's rows to through
// this client, or -1.
func (s *Sharded) StreamShard(buffer, stream string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.homes[streamKey{buffer, stream}]; ok {
		return i
	}
	return -1
}

// CloseStream closes stream on the shard it last wrote to through this
// client (on every shard when it wrote none here), and returns how many
// open trajectories it closed.
func (s *Sharded) CloseStream(ctx context.Context, name, stream string) (int, error) {
	if i := s.StreamShard(name, stream); i >= 0 {
		return s.shards[i].c.CloseStream(ctx, name, stream)
	}
	var total atomic.Int64
	errs := s.each(ctx, func(ctx context.Context, _ int, c *Client) error {
		n, err := c.CloseStream(ctx, name, stream)
		total.Add(int64(n))
		return err
	})
	return int(total.Load()), errors.Join(errs...)
}

// DeleteBuffer deletes the buffer on every shard; a shard that does not
// hold it is not an error. The errors of the others are joined.
func (s *Sharded) DeleteBuffer(ctx context.Context, name string) error {
	errs := s.each(ctx, func(ctx context.Context, _ int, c *Client) error {
		if err := c.DeleteBuffer(ctx, name); err != nil && !IsNotFound(err) {
			return err
		}
		return nil
	})
	s.mu.Lock()
	for k := range s.stats {
		if strings.HasPrefix(k, name+"\x00") {
			delete(s.stats, k)
		}
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// Infos returns every shard's info of the buffer; errs[i] is shard i's
// failure.
func (s *Sharded) Infos(ctx context.Context, name string) (infos []Info, errs []error) {
	infos = make([]Info, len(s.shards))
	errs = s.each(ctx, func(ctx context.Context, i int, c *Client) error {
		var err error
		infos[i], err = c.Info(ctx, name)
		return err
	})
	return infos, errs
}

// shardStats returns the buffer's per-shard figures (with the slice
// figures for sliceLen > 0), asking the shards again when the cached ones
// are older than StatsTTL. A shard that does not answer within
// ShardTimeout has a nil entry.
func (s *Sharded) shardStats(ctx context.Context, name string, sliceLen int) *shardedStats {
	key := name + "\x00" + strconv.Itoa(sliceLen)
	s.mu.Lock()
	st := s.stats[key]
	s.mu.Unlock()
	if st != nil && time.Since(st.at) < s.opts.StatsTTL {
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.ShardTimeout)
	defer cancel()
	st = &shardedStats{at: time.Now(), infos: make([]*Info, len(s.shards))}
	s.each(ctx, func(ctx context.Context, i int, c *Client) error {
		info, err := c.Info(ctx, name)
		if sliceLen > 0 {
			info, err = c.InfoForSlices(ctx, name, sliceLen)
		}
		if err == nil {
			st.infos[i] = &info
		}
		return err
	})
	s.mu.Lock()
	s.stats[key] = st
	s.mu.Unlock()
	return st
}

// Sample draws a batch from the shards as if one buffer held all their
// rows. Uniform, prioritized and slice samplers (others are
// ErrBadRequest).
//
// The batch (for slices: its slices) is split across shards by a
// multinomial draw in proportion to each shard's eligible rows (uniform),
// their total sampling priority (prioritized) or the trajectories slices
// are cut from (slice), from figures at most StatsTTL old; the shards are sampled
// in parallel with return_prob, and rows a shard did not deliver within
// ShardTimeout are drawn again from the shards that answered, in
// proportion. The answer holds the tensors of a single answer, concatenated
// shard after shard, plus "shard" (int64); "prob" is each row's
// probability under the merged draw, and "weight" (prioritized) is the
// single-buffer importance weight (q / min q)^-beta with the minimum over
// the shards that took part. Metadata "shards_used" and "shards_missing"
// list shard numbers ("0,2"). With a seed, the same request over the same
// shard contents gives the same batch.
func (s *Sharded) Sample(ctx context.Context, name string, req *SampleRequest) (*Batch, error) {
	if req == nil {
		req = &SampleRequest{}
	}
	kind := cmp.Or(req.Sampler, "uniform")
	if kind != "uniform" && kind != "prioritized" && kind != "slice" {
		return nil, fmt.Errorf("sample %s: sampler %q: %w: a sharded client samples with uniform, prioritized and slice only", name, kind, ErrBadRequest)
	}
	units, sliceLen, err := shardedShape(req, kind)
	if err != nil {
		return nil, fmt.Errorf("sample %s: %w", name, err)
	}
	st := s.shardStats(ctx, name, sliceLen)
	weights := make([]float64, len(s.shards))
	var spec *Spec
	for i, info := range st.infos {
		if info == nil {
			continue
		}
		if spec == nil {
			spec = &info.Spec
		}
		weights[i] = drawMass(info, req, kind)
	}
	if spec == nil {
		return nil, fmt.Errorf("sample %s: %w (asked %d)", name, ErrNoShards, len(s.shards))
	}
	parts := make([]*Batch, len(s.shards))
	missing := map[int]bool{}
	for i, info := range st.infos {
		if info == nil {
			missing[i] = true
		}
	}
	// A request with a seed splits with a generator of its own, seeded
	// from it: the same seed over the same shard contents gives the same
	// batch. Without one, the client's shared generator.
	var splitRNG *rand.Rand
	if req.Seed != nil {
		splitRNG = rand.New(rand.NewPCG(*req.Seed, 0x5348415244))
	}
	need := units
	for round := 0; need > 0; round++ {
		counts := s.split(need, weights, missing, splitRNG)
		if counts == nil {
			if round == 0 {
				return nil, fmt.Errorf("sample %s: %w: no shard holds a row that can be drawn", name, ErrNotReady)
			}
			return nil, fmt.Errorf("sample %s: %w: every shard asked failed", name, ErrNoShards)
		}
		got := s.sampleParts(ctx, name, req, sliceLen, counts, parts, missing)
		need -= got
		if round > len(s.shards) {
			return nil, fmt.Errorf("sample %s: shards keep failing: %w", name, ErrNoShards)
		}
	}
	return mergeShards(parts, missing, kind, req)
}

// shardedShape returns what a sample is split in (rows, or slices) and
// the slice length (0 for transition samplers), as the server reads
// batch_size, num_slices and slice_len.
func shardedShape(req *SampleRequest, kind string) (units, sliceLen int, err error) {
	if kind != "slice" {
		if req.BatchSize < 1 {
			return 0, 0, fmt.Errorf("batch_size must be at least 1: %w", ErrBadRequest)
		}
		return req.BatchSize, 0, nil
	}
	B, S, L := req.BatchSize, req.NumSlices, req.SliceLen
	switch {
	case S > 0 && L > 0 && (B == 0 || B == S*L):
	case S == 0 && L > 0 && B > 0 && B%L == 0:
		S = B / L
	case L == 0 && S > 0 && B > 0 && B%S == 0:
		L = B / S
	default:
		return 0, 0, fmt.Errorf("slices need two of batch_size, num_slices and slice_len (and batch_size = num_slices x slice_len): %w", ErrBadRequest)
	}
	return S, L, nil
}

// drawMass is what a shard's share of a batch is proportional to.
func drawMass(info *Info, req *SampleRequest, kind string) float64 {
	nextKnown := info.Spec.CompactObs && (req.NextState == nil || *req.NextState) && !req.IncludeIncomplete
	sm := info.Sampling
	if kind == "slice" {
		if sm.Slices == nil {
			return 0
		}
		if req.StrictLength == nil || *req.StrictLength {
			return float64(sm.Slices.AtLeast)
		}
		return float64(sm.Slices.Trajectories)
	}
	switch {
	case kind == "prioritized" && nextKnown:
		return sm.NextKnownPriorityTotal
	case kind == "prioritized":
		return sm.PriorityTotal
	case nextKnown:
		return float64(sm.NextKnownRows)
	}
	return float64(sm.Rows)
}

// split draws how many of n rows each shard gives: a multinomial draw with
// probabilities proportional to weights, over the shards not missing. Nil
// when no such shard has any weight.
func (s *Sharded) split(n int, weights []float64, missing map[int]bool, rng *rand.Rand) []int {
	total := 0.0
	for i, w := range weights {
		if !missing[i] {
			total += w
		}
	}
	if !(total > 0) {
		return nil
	}
	counts := make([]int, len(weights))
	if rng == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		rng = s.rng
	}
	for range n {
		x := rng.Float64() * total
		last := -1
		for i, w := range weights {
			if missing[i] || w <= 0 {
				continue
			}
			last = i
			if x < w {
				break
			}
			x -= w
		}
		counts[last]++
	}
	return counts
}

// sampleParts asks each shard with a count for that many rows, in
// parallel, appends what comes back to parts and marks shards that fail as
// missing. It returns the rows delivered.
func (s *Sharded) sampleParts(ctx context.Context, name string, req *SampleRequest, sliceLen int, counts []int, parts []*Batch, missing map[int]bool) int {
	var wg sync.WaitGroup
	got := make([]*Batch, len(counts))
	for i, n := range counts {
		if n == 0 {
			continue
		}
		r := *req
		r.BatchSize, r.ReturnProb = n, true
		if sliceLen > 0 {
			r.BatchSize, r.NumSlices, r.SliceLen = 0, n, sliceLen
		}
		if req.Seed != nil {
			// Distinct per shard and per round, and reproducible.
			sd := *req.Seed + uint64(i+1)*0x9e3779b97f4a7c15 + uint64(len(missing))
			r.Seed = &sd
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, s.opts.ShardTimeout)
			defer cancel()
			if b, err := s.shards[i].c.Sample(ctx, name, &r); err == nil {
				got[i] = b
			}
		})
	}
	wg.Wait()
	delivered := 0
	for i, n := range counts {
		if n == 0 {
			continue
		}
		if got[i] == nil || got[i].Rows() != n {
			missing[i] = true
			continue
		}
		delivered += n
		if parts[i] == nil {
			parts[i] = got[i]
		} else {
			parts[i] = concatBatches(parts[i], got[i])
		}
	}
	return delivered
}

// concatBatches appends b's rows to a's (same tensors), keeping a's
// metadata but for the figures return_prob reports, which are b's (newer).
func concatBatches(a, b *Batch) *Batch {
	out := &Batch{Metadata: b.Metadata}
	for _, t := range a.Tensors {
		u, ok := b.Tensor(t.Name)
		if !ok {
			continue
		}
		shape := slices.Clone(t.Shape)
		shape[0] += u.Shape[0]
		out.Tensors = append(out.Tensors, codec.Tensor{Name: t.Name, DType: t.DType, Shape: shape, Data: append(slices.Clip(t.Data), u.Data...)})
	}
	return out
}

// mergeShards joins the shards' parts into one batch with the merged
// draw's probabilities and weights.
func mergeShards(parts []*Batch, missing map[int]bool, kind string, req *SampleRequest) (*Batch, error) {
	// The figures of the draw: the sum over the shards that took part of
	// what each drew among, and the smallest q among them.
	var mass, qmin float64
	qmin = math.Inf(1)
	var used []string
	var idx []int
	type figures struct {
		size  int64
		total float64
	}
	fig := make([]figures, len(parts))
	for i, p := range parts {
		if p == nil || missing[i] {
			continue
		}
		size, total, pmin, err := probFigures(p)
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
		fig[i] = figures{size, total}
		if kind == "prioritized" {
			mass += total
			if pmin > 0 {
				qmin = min(qmin, pmin)
			}
		} else {
			mass += float64(size)
		}
		used = append(used, strconv.Itoa(i))
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return nil, ErrNoShards
	}
	var miss []string
	for i := range parts {
		if missing[i] {
			miss = append(miss, strconv.Itoa(i))
		}
	}
	beta := 0.4
	if req.Beta != nil {
		beta = *req.Beta
	}
	first := parts[idx[0]]
	out := &Batch{Metadata: map[string]string{"shards_used": strings.Join(used, ","), "shards_missing": strings.Join(miss, ",")}}
	for _, t := range first.Tensors {
		var data []byte
		rows := 0
		for _, i := range idx {
			u, ok := parts[i].Tensor(t.Name)
			if !ok || u.DType != t.DType || !slices.Equal(u.Shape[1:], t.Shape[1:]) {
				return nil, fmt.Errorf("shards answer tensor %q differently (dtype or shape): do their buffers have the same spec?", t.Name)
			}
			rows += u.Shape[0]
			data = append(data, u.Data...)
		}
		shape := slices.Clone(t.Shape)
		shape[0] = rows
		out.Tensors = append(out.Tensors, codec.Tensor{Name: t.Name, DType: t.DType, Shape: shape, Data: data})
	}
	// Per row: the shard, the merged probability and (prioritized) the
	// weight, from q = prob * the shard's total.
	var shard, prob, weight []byte
	for _, i := range idx {
		p := parts[i]
		size, total := fig[i].size, fig[i].total
		pt, ok := p.Tensor("prob")
		if !ok {
			return nil, fmt.Errorf("shard %d answered without prob (a server older than return_prob?)", i)
		}
		for r := range pt.Elems() {
			pr := math.Float64frombits(binary.LittleEndian.Uint64(pt.Data[8*r:]))
			shard = binary.LittleEndian.AppendUint64(shard, uint64(i))
			switch kind {
			case "prioritized":
				q := pr * total
				prob = binary.LittleEndian.AppendUint64(prob, math.Float64bits(q/mass))
				weight = binary.LittleEndian.AppendUint32(weight, math.Float32bits(float32(math.Pow(q/qmin, -beta))))
			case "slice":
				// 1/(T_s * starts) within the shard; the shard is drawn
				// with probability T_s / T.
				prob = binary.LittleEndian.AppendUint64(prob, math.Float64bits(pr*float64(size)/mass))
			default:
				prob = binary.LittleEndian.AppendUint64(prob, math.Float64bits(1/mass))
			}
		}
	}
	n := len(shard) / 8
	rowShape := []int{n}
	if pt, ok := out.Tensor("prob"); ok {
		rowShape = pt.Shape // [S, L] for slices
	}
	setTensor(out, codec.Tensor{Name: "shard", DType: "int64", Shape: slices.Clone(rowShape), Data: shard})
	setTensor(out, codec.Tensor{Name: "prob", DType: "float64", Shape: slices.Clone(rowShape), Data: prob})
	if kind == "prioritized" {
		setTensor(out, codec.Tensor{Name: "weight", DType: "float32", Shape: []int{n}, Data: weight})
	}
	out.Metadata["size"] = strconv.FormatFloat(mass, 'g', -1, 64)
	return out, nil
}

func setTensor(b *Batch, t codec.Tensor) {
	for i := range b.Tensors {
		if b.Tensors[i].Name == t.Name {
			b.Tensors[i] = t
			return
		}
	}
	b.Tensors = append(b.Tensors, t)
}

// probFigures reads what a return_prob answer says its draw was taken
// over.
func probFigures(b *Batch) (size int64, total, qmin float64, err error) {
	md := b.Metadata
	if size, err = strconv.ParseInt(md["size"], 10, 64); err != nil {
		return 0, 0, 0, fmt.Errorf("answer metadata size %q: %w", md["size"], err)
	}
	if total, err = strconv.ParseFloat(md["priority_total"], 64); err != nil {
		return 0, 0, 0, fmt.Errorf("answer metadata priority_total %q: %w", md["priority_total"], err)
	}
	if qmin, err = strconv.ParseFloat(md["priority_min"], 64); err != nil {
		return 0, 0, 0, fmt.Errorf("answer metadata priority_min %q: %w", md["priority_min"], err)
	}
	return size, total, qmin, nil
}

// Health asks every shard for /v1/health; errs[i] is shard i's failure
// (nil when it answered).
func (s *Sharded) Health(ctx context.Context) (errs []error) {
	return s.each(ctx, func(ctx context.Context, _ int, c *Client) error { return c.Health(ctx) })
}

// SetRateLimit sets the same rate limit on every shard. Each shard's
// limiter counts its own inserts and samples: with writes and samples
// spread in proportion (as Sharded spreads them), every shard holds the
// ratio, and with it the whole.
func (s *Sharded) SetRateLimit(ctx context.Context, name string, limit *RateLimit) error {
	return errors.Join(s.each(ctx, func(ctx context.Context, _ int, c *Client) error {
		_, err := c.SetRateLimit(ctx, name, limit)
		return err
	})...)
}

// UpdateFields sets mutable fields of rows named by (shard, seq) (e.g.
// recurrent states recomputed by a learner), each shard's rows sent to it
// in parallel; fields are [N, ...] tensors in the order of seq.
func (s *Sharded) UpdateFields(ctx context.Context, name string, shard, seq []int64, fields ...codec.Tensor) (updated, stale int, err error) {
	if len(shard) != len(seq) {
		return 0, 0, fmt.Errorf("update %s: %d shards, %d seqs: %w", name, len(shard), len(seq), ErrBadRequest)
	}
	rows := make([][]int, len(s.shards))
	for k, sh := range shard {
		if sh < 0 || int(sh) >= len(s.shards) {
			return 0, 0, fmt.Errorf("update %s: shard %d of %d: %w", name, sh, len(s.shards), ErrBadRequest)
		}
		rows[sh] = append(rows[sh], k)
	}
	for _, f := range fields {
		if len(f.Shape) == 0 || f.Shape[0] != len(seq) {
			return 0, 0, fmt.Errorf("update %s: field %q has shape %v, want [%d, ...]: %w", name, f.Name, f.Shape, len(seq), ErrBadRequest)
		}
	}
	var u, st atomic.Int64
	errs := s.each(ctx, func(ctx context.Context, i int, c *Client) error {
		if len(rows[i]) == 0 {
			return nil
		}
		part := make([]int64, len(rows[i]))
		parts := make([]codec.Tensor, len(fields))
		for j, f := range fields {
			per := len(f.Data) / len(seq)
			data := make([]byte, 0, per*len(rows[i]))
			for _, k := range rows[i] {
				data = append(data, f.Data[k*per:(k+1)*per]...)
			}
			shape := slices.Clone(f.Shape)
			shape[0] = len(rows[i])
			parts[j] = codec.Tensor{Name: f.Name, DType: f.DType, Shape: shape, Data: data}
		}
		for j, k := range rows[i] {
			part[j] = seq[k]
		}
		a, b, err := c.UpdateFields(ctx, name, part, parts...)
		u.Add(int64(a))
		st.Add(int64(b))
		return err
	})
	return int(u.Load()), int(st.Load()), errors.Join(errs...)
}

// UpdatePriorities sets priorities of rows named by (shard, seq), each
// shard's part sent to it in parallel.
func (s *Sharded) UpdatePriorities(ctx context.Context, name string, shard, seq []int64, prio []float64) (updated, stale int, err error) {
	if len(shard) != len(seq) || len(seq) != len(prio) {
		return 0, 0, fmt.Errorf("update priorities %s: %d shards, %d seqs, %d priorities: %w", name, len(shard), len(seq), len(prio), ErrBadRequest)
	}
	bySeq := make([][]int64, len(s.shards))
	byPrio := make([][]float64, len(s.shards))
	for k, sh := range shard {
		if sh < 0 || int(sh) >= len(s.shards) {
			return 0, 0, fmt.Errorf("update priorities %s: shard %d of %d: %w", name, sh, len(s.shards), ErrBadRequest)
		}
		bySeq[sh] = append(bySeq[sh], seq[k])
		byPrio[sh] = append(byPrio[sh], prio[k])
	}
	var u, st atomic.Int64
	errs := s.each(ctx, func(ctx context.Context, i int, c *Client) error {
		if len(bySeq[i]) == 0 {
			return nil
		}
		a, b, err := c.UpdatePriorities(ctx, name, bySeq[i], byPrio[i])
		u.Add(int64(a))
		st.Add(int64(b))
		return err
	})
	return int(u.Load()), int(st.Load()), errors.Join(errs...)
}
