package rbd

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/rbdb/rbd/sampler"
	"github.com/rbdb/rbd/storage"
)

// SampleRequest is a sample request, as in the HTTP contract (POST
// .../sample). Zero values mean the documented defaults.
type SampleRequest struct {
	// BatchSize is the number of rows (transition samplers) or
	// NumSlices*SliceLen (slice samplers).
	BatchSize int `json:"batch_size,omitempty"`
	// Sampler is one of sampler.Kinds; "" means uniform.
	Sampler string `json:"sampler,omitempty"`
	// Seed makes the sample reproducible for the same store state; nil
	// draws a random seed. Without-replacement samplers use it only for the
	// permutation of a new epoch.
	Seed *uint64 `json:"seed,omitempty"`
	// Keys lists the fields to return; nil means every stored field, plus
	// next.<k> for the obs keys when next-state reconstruction is on.
	Keys []string `json:"keys"`
	// NextState turns next-state reconstruction on or off; nil means on
	// for compact_obs buffers.
	NextState *bool `json:"next_state,omitempty"`
	// NStep asks for n-step returns.
	NStep *NStep `json:"n_step,omitempty"`
	// NumSlices and SliceLen shape slice samples (give two of BatchSize,
	// NumSlices and SliceLen).
	NumSlices int `json:"num_slices,omitempty"`
	SliceLen  int `json:"slice_len,omitempty"`
	// StrictLength (default true) draws slices only from trajectories with
	// SliceLen live rows; false pads shorter slices and returns a mask.
	StrictLength *bool `json:"strict_length,omitempty"`
	// Beta is the importance-weight exponent (default 0.4).
	Beta *float64 `json:"beta,omitempty"`
	// Consumer names the epoch of without-replacement samplers.
	Consumer string `json:"consumer,omitempty"`
	// IncludeIncomplete lets transition samplers return rows whose next
	// observation is not known yet, flagged by next.<k>_valid = false.
	IncludeIncomplete bool `json:"include_incomplete,omitempty"`
	// DropLast drops the short last batch of a without-replacement epoch.
	DropLast bool `json:"drop_last,omitempty"`
	// Fill is the value of unknown next observations: "zero" (default) or
	// "nan" (float keys only).
	Fill string `json:"fill,omitempty"`
	// TimeoutMS is how long to wait for data that can satisfy the request
	// (0: answer at once).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MinPolicyVersion, when set, makes samplers return only rows whose
	// policy_version is at least this (slice samplers: slices whose first
	// row is), for staleness control; until such rows exist the sample is
	// not ready.
	MinPolicyVersion *int64 `json:"min_policy_version,omitempty"`
	// ReturnProb adds "prob" (float64 [B]): each row's probability of
	// being drawn by this sampler from this buffer, and in the answer's
	// metadata the buffer's size (rows drawn among; for slices, the
	// trajectories slices are drawn from), priority_total and priority_min
	// at the draw. Sharded clients weigh shards with it. Uniform,
	// prioritized and slice samplers only.
	ReturnProb bool `json:"return_prob,omitempty"`
}

var sampleRequestKeys = []string{"batch_size", "sampler", "seed", "keys", "next_state", "n_step", "num_slices",
	"slice_len", "strict_length", "beta", "consumer", "include_incomplete", "drop_last", "fill", "timeout_ms", "min_policy_version", "return_prob"}

// NStep asks for n-step returns with discount Gamma.
type NStep struct {
	N     int     `json:"n"`
	Gamma float64 `json:"gamma"`
}

// ErrBadRequest is wrapped by every RequestError: a request that no data
// can ever satisfy (HTTP 400).
var ErrBadRequest = errors.New("rbd: bad request")

// RequestError names the request field at fault.
type RequestError struct {
	Field string
	Msg   string
}

func (e *RequestError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Msg) }

// Unwrap returns ErrBadRequest.
func (e *RequestError) Unwrap() error { return ErrBadRequest }

func reqErr(field, format string, args ...any) error {
	return &RequestError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ParseSampleRequest decodes a JSON sample request. Unknown keys and wrong
// types are errors naming the key; seed may be any integer (taken modulo
// 2^64), given as a JSON number.
func ParseSampleRequest(data []byte) (*SampleRequest, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil || raw == nil {
		if err == nil {
			err = errors.New("null")
		}
		return nil, reqErr("body", "not a JSON object: %v", err)
	}
	// encoding/json matches keys case-insensitively; the contract's keys
	// are exact.
	for k := range raw {
		if !slices.Contains(sampleRequestKeys, k) {
			if k == "" {
				k = `""` // an empty key still gets a visible name
			}
			return nil, reqErr(k, "unknown key (want one of %s)", strings.Join(sampleRequestKeys, ", "))
		}
	}
	var seed *uint64
	if v, ok := raw["seed"]; ok {
		delete(raw, "seed")
		if string(v) != "null" {
			s, err := parseSeed(v)
			if err != nil {
				return nil, err
			}
			seed = &s
		}
	}
	if v, ok := raw["n_step"]; ok && string(v) != "null" {
		var ns map[string]json.RawMessage
		if err := json.Unmarshal(v, &ns); err != nil {
			return nil, reqErr("n_step", "must be an object {\"n\": int, \"gamma\": number}")
		}
		for k := range ns {
			if k != "n" && k != "gamma" {
				return nil, reqErr("n_step."+k, "unknown key (want n and gamma)")
			}
		}
	}
	// Each value is decoded straight into its field (found by its json
	// tag), in the order of sampleRequestKeys so that the first bad key
	// reported does not depend on map order.
	req := &SampleRequest{Seed: seed}
	fields := reflect.ValueOf(req).Elem()
	for _, k := range sampleRequestKeys {
		v, ok := raw[k]
		if !ok {
			continue
		}
		i, ok := sampleRequestFields[k]
		if !ok {
			return nil, reqErr(k, "internal error: no field for this key")
		}
		if err := json.Unmarshal(v, fields.Field(i).Addr().Interface()); err != nil {
			if ute, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
				field := k
				if ute.Field != "" {
					field += "." + ute.Field
				}
				return nil, reqErr(field, "must be %s", ute.Type)
			}
			return nil, reqErr(k, "%v", err)
		}
	}
	return req, nil
}

// sampleRequestFields maps each JSON key of SampleRequest to its field
// index, from the struct's tags (read once; never written after).
var sampleRequestFields = func() map[string]int {
	m := map[string]int{}
	t := reflect.TypeFor[SampleRequest]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			m[name] = i
		}
	}
	return m
}()

func parseSeed(v json.RawMessage) (uint64, error) {
	s := strings.TrimSpace(string(v))
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return uint64(i), nil
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	return 0, reqErr("seed", "must be an integer in [-2^63, 2^64), got %s", s)
}

// plan is a validated request against one buffer.
type plan struct {
	req       *SampleRequest
	params    sampler.Params
	spec      storage.Spec
	compact   bool
	nextState bool
	nstep     *NStep
	stored    []storage.Column // stored fields to gather, in output order
	// atRow and atLast split stored: with n-step, the next.* fields the
	// transform takes from the window's last row are gathered there.
	atRow, atLast []storage.Column
	// flagCols are the episode flags of stored (next.done, .terminated,
	// .truncated: bool scalars, never mutable) that are not gathered but
	// written from the rows' metadata, which the draw has read already
	// and which holds the same flags (an extend derives a row's record
	// flags from these columns): in a memmap buffer, three lines a row in
	// three files fewer to read. Kept in atRow when nothing else is
	// there, so that the rows are still copied and checked.
	flagCols []flagCol
	outKeys  []string // every requested key, in order
	recon    []string // obs keys k whose next.<k> is reconstructed
	fillNaN  bool
	slices   bool
	rows     int // output rows (B or S*L)
	// minVersion is min_policy_version, -1 without one.
	minVersion int64
	// rewardColumn is next.reward, for n-step returns.
	rewardColumn storage.Column
	// answerBytes bounds the memory of the answer's tensors as the
	// buffer's pool hands it out (sizes rounded up to powers of two).
	answerBytes int64
	// gatherLocked copies the rows in the draw's critical section
	// (storage.Index.CopyIndexed) instead of lock-free afterwards: for
	// an answer of a few hundred kilobytes at most, writers wait less
	// than the stamp checks of a lock-free copy would cost.
	gatherLocked bool
	// reconNames and validNames are next.<k> and next.<k>_valid for each
	// k of recon, made once per plan rather than once per batch.
	reconNames, validNames []string
}

// A plan depends on the request's shape, never on its seed or timeout, and
// on the buffer's spec, which does not change (its rate limit, which can,
// plays no part). A learner sends the same shape over and over (a stream
// always does), so each buffer keeps its last plan and reuses it for a
// request of the same shape: planning allocates a dozen slices and maps,
// which at tens of thousands of samples a second kept the garbage
// collector busy.

// planKey is a request's shape: every field of SampleRequest but Seed,
// TimeoutMS and Keys (compared on their own). TestPlanKeyCoversRequest
// fails when SampleRequest gains a field this does not account for.
type planKey struct {
	sampler                        string
	batchSize, numSlices, sliceLen int
	nextState, strictLength        int8 // -1 unset, 0 false, 1 true
	nstep                          NStep
	hasNStep                       bool
	beta                           float64
	hasBeta                        bool
	consumer                       string
	includeIncomplete, dropLast    bool
	fill                           string
	minVersion                     int64
	hasMinVersion                  bool
	returnProb                     bool
	keysNil                        bool
	maxBytes                       int64
}

func optBool(v *bool) int8 {
	switch {
	case v == nil:
		return -1
	case *v:
		return 1
	}
	return 0
}

func planKeyOf(req *SampleRequest, maxBytes int64) planKey {
	k := planKey{sampler: req.Sampler, batchSize: req.BatchSize, numSlices: req.NumSlices, sliceLen: req.SliceLen,
		nextState: optBool(req.NextState), strictLength: optBool(req.StrictLength), consumer: req.Consumer,
		includeIncomplete: req.IncludeIncomplete, dropLast: req.DropLast, fill: req.Fill, returnProb: req.ReturnProb,
		keysNil: req.Keys == nil, maxBytes: maxBytes}
	if req.NStep != nil {
		k.nstep, k.hasNStep = *req.NStep, true
	}
	if req.Beta != nil {
		k.beta, k.hasBeta = *req.Beta, true
	}
	if req.MinPolicyVersion != nil {
		k.minVersion, k.hasMinVersion = *req.MinPolicyVersion, true
	}
	return k
}

// cachedPlan is a buffer's last plan and the shape it was made for.
type cachedPlan struct {
	key  planKey
	keys []string
	p    *plan
}

// plan returns the plan of req: the buffer's last one when req has its
// shape, else a new one (which becomes the last). Plans are read-only once
// made, so samples share them.
func (b *Buffer) plan(req *SampleRequest, maxBytes int64) (*plan, error) {
	if req.TimeoutMS < 0 { // not part of the shape: checked for every request
		return nil, reqErr("timeout_ms", "must not be negative")
	}
	key := planKeyOf(req, maxBytes)
	if c := b.lastPlan.Load(); c != nil && c.key == key && slices.Equal(c.keys, req.Keys) {
		return c.p, nil
	}
	shape := shapeOf(req)
	p, err := b.planSample(shape, maxBytes)
	if err != nil {
		return nil, err
	}
	b.lastPlan.Store(&cachedPlan{key: key, keys: shape.Keys, p: p})
	return p, nil
}

// shapeOf copies what a plan may keep of req: everything but the seed and
// the timeout, with copies of what req points to, so that a caller that
// changes its request (its NStep, say) after a sample cannot change a plan
// that other requests of the old shape still use.
func shapeOf(req *SampleRequest) *SampleRequest {
	shape := *req
	shape.Seed, shape.TimeoutMS = nil, 0
	shape.Keys = slices.Clone(req.Keys)
	shape.NextState = clonePtr(req.NextState)
	shape.NStep = clonePtr(req.NStep)
	shape.StrictLength = clonePtr(req.StrictLength)
	shape.Beta = clonePtr(req.Beta)
	shape.MinPolicyVersion = clonePtr(req.MinPolicyVersion)
	return &shape
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// gatherLockedMaxBytes bounds the answers a sample copies while it holds the
// index (writers wait for it): up to 2048 CartPole rows, a sample of about
// 0.15 ms in all (256 rows: 0.02 ms; BenchmarkSampleBatchSizes).
const gatherLockedMaxBytes = 256 << 10

// maxSampleRows bounds one answer; larger batches are a 400.
const maxSampleRows = 1 << 22

func (b *Buffer) planSample(req *SampleRequest, maxBytes int64) (*plan, error) {
	spec := b.Spec()
	p := &plan{req: req, spec: spec, compact: spec.CompactObs, nstep: req.NStep, minVersion: -1}
	kind := req.Sampler
	if kind == "" {
		kind = sampler.Uniform
	}
	if !slices.Contains(sampler.Kinds, kind) {
		return nil, reqErr("sampler", "unknown sampler %q (want one of %s)", kind, strings.Join(sampler.Kinds, ", "))
	}
	if sampler.IsPrioritized(kind) && spec.Priority == nil {
		return nil, reqErr("sampler", "%q needs a buffer created with \"priority\" in its spec", kind)
	}
	p.slices = sampler.IsSlice(kind)
	strict := req.StrictLength == nil || *req.StrictLength
	beta := 0.4
	if req.Beta != nil {
		beta = *req.Beta
		if !(beta >= 0) || math.IsInf(beta, 0) {
			return nil, reqErr("beta", "must be a finite number >= 0")
		}
	}
	p.params = sampler.Params{Kind: kind, StrictLength: strict, Beta: beta, DropLast: req.DropLast, Consumer: req.Consumer}
	for _, f := range []struct {
		name string
		v    int
	}{{"batch_size", req.BatchSize}, {"num_slices", req.NumSlices}, {"slice_len", req.SliceLen}} {
		if f.v < 0 {
			return nil, reqErr(f.name, "must not be negative")
		}
		// Bounded one by one before any product is taken: num_slices x
		// slice_len of two huge numbers would wrap around.
		if f.v > maxSampleRows {
			return nil, reqErr(f.name, "%d is more than the %d rows an answer may hold", f.v, maxSampleRows)
		}
	}
	if p.slices {
		if err := sliceShape(req, &p.params); err != nil {
			return nil, err
		}
		if int64(p.params.SliceLen) > spec.Capacity {
			return nil, reqErr("slice_len", "%d is larger than the buffer's capacity %d", p.params.SliceLen, spec.Capacity)
		}
		p.rows = p.params.NumSlices * p.params.SliceLen
	} else {
		if req.NumSlices != 0 || req.SliceLen != 0 {
			return nil, reqErr("num_slices", "num_slices and slice_len apply to slice samplers only")
		}
		if req.BatchSize < 1 {
			return nil, reqErr("batch_size", "must be at least 1")
		}
		if req.StrictLength != nil {
			return nil, reqErr("strict_length", "applies to slice samplers only")
		}
		p.params.BatchSize = req.BatchSize
		p.rows = req.BatchSize
	}
	if p.rows > maxSampleRows {
		return nil, reqErr("batch_size", "%d rows is more than the %d an answer may hold", p.rows, maxSampleRows)
	}
	if req.Consumer != "" && kind != sampler.WithoutReplacement && kind != sampler.SliceWithoutReplacement {
		return nil, reqErr("consumer", "applies to without-replacement samplers only")
	}
	if req.DropLast && kind != sampler.WithoutReplacement && kind != sampler.SliceWithoutReplacement {
		return nil, reqErr("drop_last", "applies to without-replacement samplers only")
	}
	p.nextState = p.compact
	if req.NextState != nil {
		p.nextState = *req.NextState
	}
	if p.nextState && p.compact {
		p.recon = append(p.recon, spec.ObsKeys...)
	}
	switch req.Fill {
	case "", "zero":
	case "nan":
		p.fillNaN = true
	default:
		return nil, reqErr("fill", "must be \"zero\" or \"nan\", got %q", req.Fill)
	}
	if n := req.NStep; n != nil {
		if n.N < 1 {
			return nil, reqErr("n_step.n", "must be at least 1")
		}
		if !(n.Gamma >= 0 && n.Gamma <= 1) {
			return nil, reqErr("n_step.gamma", "must be in [0, 1]")
		}
		f, ok := spec.Field("next.reward")
		if !ok || (f.DType != storage.Float32 && f.DType != storage.Float64) || len(f.Shape) != 0 {
			return nil, reqErr("n_step", "needs a scalar float32 or float64 field next.reward")
		}
		if p.compact && !p.nextState {
			return nil, reqErr("n_step", "needs next_state on a compact_obs buffer (the bootstrap observation is rebuilt)")
		}
		p.rewardColumn, _ = b.Column("next.reward")
	}
	if req.ReturnProb {
		if kind != sampler.Uniform && kind != sampler.Prioritized && kind != sampler.Slice {
			return nil, reqErr("return_prob", "applies to the uniform, prioritized and slice samplers (not %q)", kind)
		}
		if req.MinPolicyVersion != nil {
			return nil, reqErr("return_prob", "cannot be combined with min_policy_version: the rows drawn among are not counted then")
		}
		if _, ok := spec.Field("prob"); ok {
			return nil, reqErr("return_prob", "this buffer has a field named \"prob\" (created before the name was reserved)")
		}
	}
	if req.IncludeIncomplete && (p.slices || len(p.recon) == 0) {
		return nil, reqErr("include_incomplete", "applies to transition samplers on compact_obs buffers with next_state")
	}
	if err := b.planKeys(p); err != nil {
		return nil, err
	}
	for _, c := range p.stored {
		if p.nstep != nil && isNStepNext(c.Name) {
			p.atLast = append(p.atLast, c)
		} else if f, ok := flagOf(c.Name); ok {
			p.flagCols = append(p.flagCols, flagCol{col: c, flag: f})
		} else {
			p.atRow = append(p.atRow, c)
		}
	}
	if len(p.atRow) == 0 && len(p.flagCols) > 0 {
		for _, f := range p.flagCols {
			p.atRow = append(p.atRow, f.col)
		}
		p.flagCols = nil
	}
	if len(p.recon) > 0 && !req.IncludeIncomplete && !p.slices {
		p.params.NextKnown = true
	}
	if v := req.MinPolicyVersion; v != nil {
		if *v < 0 {
			return nil, reqErr("min_policy_version", "must be an integer >= 0, got %d", *v)
		}
		p.minVersion = *v
		p.params.MinPolicyVersion = *v // slice samplers: the slice's first row
		min := *v
		p.params.Eligible = func(_ storage.Index, m storage.RowMeta) bool {
			return m.PolicyVersion >= min
		}
	}
	var rowBytes int64 = 8 * 3
	// Per-row bytes of every tensor the answer holds, and of the scratch
	// gathers beside them: seq, traj_id, step; weight, slice_end, mask;
	// the n-step columns; the valid flags.
	perTensor := []int64{8, 8, 8, 4, 1, 1, 8, 4, 8}
	for _, k := range p.outKeys {
		if c, ok := b.columnFor(k); ok {
			rowBytes += int64(c.RowBytes)
			perTensor = append(perTensor, int64(c.RowBytes))
		}
	}
	for _, k := range p.recon {
		c, _ := b.columnFor(k)
		perTensor = append(perTensor, 1, int64(c.RowBytes)) // valid flags, tail gather
	}
	if p.nstep != nil {
		// window rewards (n per row), original and n-step rewards
		perTensor = append(perTensor, 8*min(int64(p.nstep.N), spec.Capacity), 8, 8)
	}
	for _, per := range perTensor {
		if per > math.MaxInt64/2/int64(p.rows) || p.answerBytes > math.MaxInt64/2 {
			p.answerBytes = math.MaxInt64 // no budget holds it
			break
		}
		p.answerBytes += pooledBytes(per * int64(p.rows))
	}
	if maxBytes > 0 && (rowBytes > maxBytes/int64(p.rows) || rowBytes*int64(p.rows) > maxBytes) {
		return nil, reqErr("batch_size", "the answer would hold %d rows of %d bytes, more than the %d bytes allowed (--max-response)", p.rows, rowBytes, maxBytes)
	}
	p.gatherLocked = spec.Storage != storage.KindCompressed && p.answerBytes <= gatherLockedMaxBytes
	return p, nil
}

func sliceShape(req *SampleRequest, pp *sampler.Params) error {
	B, S, L := req.BatchSize, req.NumSlices, req.SliceLen
	given := 0
	for _, v := range []int{B, S, L} {
		if v > 0 {
			given++
		}
	}
	switch {
	case given < 2:
		return reqErr("num_slices", "slice samplers need two of batch_size, num_slices and slice_len")
	case given == 3 && B != S*L:
		return reqErr("batch_size", "%d is not num_slices x slice_len = %d", B, S*L)
	case S == 0:
		if B%L != 0 {
			return reqErr("batch_size", "%d is not divisible by slice_len %d", B, L)
		}
		S = B / L
	case L == 0:
		if B%S != 0 {
			return reqErr("batch_size", "%d is not divisible by num_slices %d", B, S)
		}
		L = B / S
	}
	pp.NumSlices, pp.SliceLen = S, L
	return nil
}

func (b *Buffer) planKeys(p *plan) error {
	keys := p.req.Keys
	if keys == nil {
		keys = make([]string, 0, len(p.spec.Fields)+len(p.recon))
		for _, f := range p.spec.Fields {
			keys = append(keys, f.Name)
		}
		for _, k := range p.recon {
			keys = append(keys, "next."+k)
		}
	}
	seen := make(map[string]bool, len(keys))
	p.outKeys = make([]string, 0, len(keys)+len(p.recon))
	p.stored = make([]storage.Column, 0, len(keys))
	var recon []string
	for i, k := range keys {
		field := func() string { return fmt.Sprintf("keys[%d]", i) } // only for an error
		if seen[k] {
			return reqErr(field(), "%q is listed twice", k)
		}
		seen[k] = true
		if obs, ok := strings.CutPrefix(k, "next."); ok && slices.Contains(p.recon, obs) {
			recon = append(recon, obs)
			if f, _ := p.spec.Field(obs); p.fillNaN && !f.DType.IsFloat() {
				return reqErr("fill", "\"nan\" needs float keys, but %s is %s", k, f.DType)
			}
			p.outKeys = append(p.outKeys, k)
			continue
		}
		if _, ok := p.spec.Field(k); !ok {
			if obs, isNext := strings.CutPrefix(k, "next."); isNext && p.compact && slices.Contains(p.spec.ObsKeys, obs) {
				return reqErr(field(), "%q is rebuilt at sample time: set next_state to true", k)
			}
			return reqErr(field(), "%q is not a field of buffer %q", k, b.Name())
		}
		c, _ := b.Column(k)
		p.stored = append(p.stored, c)
		p.outKeys = append(p.outKeys, k)
	}
	// As the contract says: next.<k> comes back when <k> is among the
	// requested keys and next-state is on.
	for _, k := range p.recon {
		if seen[k] && !seen["next."+k] {
			if f, _ := p.spec.Field(k); p.fillNaN && !f.DType.IsFloat() {
				return reqErr("fill", "\"nan\" needs float keys, but next.%s is %s", k, f.DType)
			}
			recon = append(recon, k)
			p.outKeys = append(p.outKeys, "next."+k)
		}
	}
	p.recon = recon
	for _, k := range recon {
		p.reconNames = append(p.reconNames, "next."+k)
		p.validNames = append(p.validNames, "next."+k+"_valid")
	}
	return nil
}

// columnFor returns the column that shapes output key k (for reconstructed
// next.<k>, the observation column).
func (b *Buffer) columnFor(k string) (storage.Column, bool) {
	if c, ok := b.Column(k); ok && !c.Tail {
		return c, true
	}
	if obs, ok := strings.CutPrefix(k, "next."); ok {
		return b.Column(obs)
	}
	return storage.Column{}, false
}
