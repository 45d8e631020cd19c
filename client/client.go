package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/internal/tlsreload"
	"github.com/rbdb/rbd/ratelimit"
)

// Options configures a Client. The zero value (or nil) gives the defaults.
type Options struct {
	// Token, when set, is sent as "Authorization: Bearer <token>" on every
	// request.
	Token string
	// HTTPClient sends the requests. Nil means a client of its own whose
	// transport is a clone of http.DefaultTransport keeping up to 64 idle
	// connections per host. Deadlines come from the contexts passed to
	// each call; a Timeout set here applies as well.
	HTTPClient *http.Client
	// UserAgent is sent as User-Agent. Empty means "rbd-go-client/1".
	UserAgent string
	// MaxResponseBytes caps a tensor answer (Sample, Rows) the client
	// accepts. Zero means 1 GiB + 64 MiB, above the server's default
	// --max-response.
	MaxResponseBytes int64
	// CAFile, for an https:// server, holds the PEM CA certificates to
	// trust instead of the system's (a private CA). CertFile and KeyFile
	// are a client certificate for servers that require one (mutual
	// TLS). They apply to the client's own transport, not to HTTPClient.
	CAFile, CertFile, KeyFile string
	// RetryRateLimited, when positive, makes Extend and Sample try again
	// after a "rate_limited" answer, sleeping the server's Retry-After
	// between tries, for up to this long per call (the context's deadline
	// still applies). Zero returns the first ErrRateLimited.
	RetryRateLimited time.Duration
}

const (
	defaultUserAgent   = "rbd-go-client/1"
	defaultMaxResponse = 1<<30 + 64<<20
	// maxErrorBody caps how much of an error answer is kept as Message.
	maxErrorBody = 64 << 10
	// maxJSONAnswer caps a JSON answer (a buffer list is the largest).
	maxJSONAnswer = 64 << 20
	// maxDrain is how much of an unread answer is discarded to keep the
	// connection; beyond it the connection is closed instead.
	maxDrain = 256 << 10
)

// Client talks to one rbd server. It is safe for concurrent use.
type Client struct {
	base        *url.URL
	hc          *http.Client
	token       string
	userAgent   string
	maxResponse int64
	// retryRateLimited is Options.RetryRateLimited.
	retryRateLimited time.Duration
}

// New returns a client for the server at baseURL, e.g.
// "http://127.0.0.1:7450" (a path prefix is kept, for a server behind a
// proxy). opts may be nil.
func New(baseURL string, opts *Options) (*Client, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	u, err := url.Parse(baseURL)
	var errs []error
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("base URL: %w", err))
	case u.Scheme != "http" && u.Scheme != "https":
		errs = append(errs, fmt.Errorf("base URL %q: scheme must be http or https", baseURL))
	case u.Host == "":
		errs = append(errs, fmt.Errorf("base URL %q: no host", baseURL))
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		errs = append(errs, fmt.Errorf("base URL %q: must not hold a query, fragment or user info", baseURL))
	}
	if strings.ContainsAny(o.Token, "\r\n") {
		errs = append(errs, errors.New("token: must not contain line breaks"))
	}
	if o.RetryRateLimited < 0 {
		errs = append(errs, fmt.Errorf("retry rate limited: %v is negative", o.RetryRateLimited))
	}
	if o.MaxResponseBytes < 0 {
		errs = append(errs, fmt.Errorf("max response bytes: %d is negative", o.MaxResponseBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	c := &Client{base: u, hc: o.HTTPClient, token: o.Token, userAgent: o.UserAgent, maxResponse: o.MaxResponseBytes, retryRateLimited: o.RetryRateLimited}
	if c.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
			tc, err := tlsreload.ClientConfig(o.CAFile, o.CertFile, o.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("new client: %w", err)
			}
			tr.TLSClientConfig = tc
		}
		c.hc = &http.Client{Transport: tr}
	} else if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
		return nil, errors.New("new client: CAFile, CertFile and KeyFile need the client's own transport (HTTPClient is set)")
	}
	if c.userAgent == "" {
		c.userAgent = defaultUserAgent
	}
	if c.maxResponse == 0 {
		c.maxResponse = defaultMaxResponse
	}
	return c, nil
}

// body is a request body made of byte slices sent in order, without
// joining them; it can be replayed (GetBody) for redirects and retries.
type body struct {
	contentType string
	parts       [][]byte
}

func (b *body) reader() io.Reader {
	rs := make([]io.Reader, len(b.parts))
	for i, p := range b.parts {
		rs[i] = bytes.NewReader(p)
	}
	return io.MultiReader(rs...)
}

func (b *body) size() int64 {
	var n int64
	for _, p := range b.parts {
		n += int64(len(p))
	}
	return n
}

func jsonBody(v any) (*body, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return &body{contentType: "application/json", parts: [][]byte{b}}, nil
}

// safetensorsBody encodes tensors as safetensors, their Data sent in place.
func safetensorsBody(tensors []codec.Tensor) (*body, error) {
	hdr, _, err := codec.SafetensorsHeader(tensors, nil)
	if err != nil {
		return nil, fmt.Errorf("encode tensors: %w", err)
	}
	parts := make([][]byte, 0, 1+len(tensors))
	parts = append(parts, hdr)
	for _, t := range tensors {
		parts = append(parts, t.Data)
	}
	return &body{contentType: "application/octet-stream", parts: parts}, nil
}

// segment checks one path segment (a buffer, stream or collector name).
// "." and ".." cannot travel as a segment: URL cleaning would change the
// path, so they are refused here.
func segment(what, s string) (string, error) {
	if s == "" || s == "." || s == ".." {
		return "", fmt.Errorf("%s name %q cannot be used in a URL path", what, s)
	}
	return url.PathEscape(s), nil
}

// send performs one request and returns the response of a 2xx answer,
// whose body the caller must finish with readJSON, readTensors or
// discard. Any other status is read, closed and returned as *APIError.
func (c *Client) send(ctx context.Context, method, escapedPath string, query url.Values, b *body, accept string) (*http.Response, error) {
	u := *c.base
	u.RawPath = c.base.EscapedPath() + escapedPath
	p, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return nil, fmt.Errorf("request path: %w", err)
	}
	u.Path = p
	if query != nil {
		u.RawQuery = query.Encode()
	}
	var rd io.Reader
	if b != nil {
		rd = b.reader()
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if b != nil {
		req.ContentLength = b.size()
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(b.reader()), nil }
		if req.ContentLength == 0 {
			req.Body = http.NoBody
		}
		req.Header.Set("Content-Type", b.contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	req.Header.Set("User-Agent", c.userAgent)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	return nil, apiErrorOf(resp)
}

// sendRetrying is send, tried again after "rate_limited" answers for up to
// Options.RetryRateLimited, sleeping Retry-After (capped by what is left)
// between tries.
func (c *Client) sendRetrying(ctx context.Context, method, escapedPath string, query url.Values, b *body, accept string) (*http.Response, error) {
	if c.retryRateLimited <= 0 {
		return c.send(ctx, method, escapedPath, query, b, accept)
	}
	deadline := time.Now().Add(c.retryRateLimited)
	for {
		resp, err := c.send(ctx, method, escapedPath, query, b, accept)
		if !errors.Is(err, ErrRateLimited) {
			return resp, err
		}
		wait, _ := RetryAfter(err)
		left := time.Until(deadline)
		if left <= 0 {
			return nil, err
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// apiErrorOf reads a non-2xx answer into an *APIError and closes it.
func apiErrorOf(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	discard(resp)
	e := &APIError{Status: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	var eb struct {
		Error     string           `json:"error"`
		Code      string           `json:"code"`
		RateLimit *ratelimit.State `json:"rate_limit"`
	}
	if json.Unmarshal(raw, &eb) == nil && eb.Error != "" {
		e.Message, e.Code, e.RateLimit = eb.Error, eb.Code, eb.RateLimit
	} else {
		e.Message = strings.TrimSpace(string(raw))
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	return e
}

// discard reads what is left of an answer (up to maxDrain, so the
// connection can be reused) and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	_ = resp.Body.Close()
}

// readJSON decodes a JSON answer into out and closes it.
func readJSON(resp *http.Response, out any) error {
	defer discard(resp)
	if out == nil {
		return nil
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxJSONAnswer))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// readTensors reads a safetensors answer into one buffer and decodes it in
// place.
func (c *Client) readTensors(resp *http.Response) (*Batch, error) {
	defer discard(resp)
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/octet-stream" && mt != "application/vnd.safetensors" {
		return nil, fmt.Errorf("decode answer: content type %q, want application/octet-stream", resp.Header.Get("Content-Type"))
	}
	var buf []byte
	if n := resp.ContentLength; n >= 0 {
		if n > c.maxResponse {
			return nil, fmt.Errorf("decode answer: %d bytes exceeds the %d allowed (Options.MaxResponseBytes)", n, c.maxResponse)
		}
		buf = make([]byte, n)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			return nil, fmt.Errorf("read answer: %w", err)
		}
	} else {
		var err error
		buf, err = io.ReadAll(io.LimitReader(resp.Body, c.maxResponse+1))
		if err != nil {
			return nil, fmt.Errorf("read answer: %w", err)
		}
		if int64(len(buf)) > c.maxResponse {
			return nil, fmt.Errorf("decode answer: more than the %d bytes allowed (Options.MaxResponseBytes)", c.maxResponse)
		}
	}
	tensors, meta, err := codec.DecodeSafetensors(buf)
	if err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	return &Batch{Tensors: tensors, Metadata: meta}, nil
}

// acceptTensors is the Accept header of tensor answers.
const acceptTensors = "application/octet-stream"

// bufferPath returns the escaped path of a buffer plus rest.
func bufferPath(name, rest string) (string, error) {
	seg, err := segment("buffer", name)
	if err != nil {
		return "", err
	}
	return "/v1/buffers/" + seg + rest, nil
}

// Health checks that the server is up (GET /v1/health; no token needed).
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.send(ctx, http.MethodGet, "/v1/health", nil, nil, "application/json")
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	var ans struct {
		Status string `json:"status"`
	}
	if err := readJSON(resp, &ans); err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if ans.Status != "ok" {
		return fmt.Errorf("health: server status %q", ans.Status)
	}
	return nil
}

// Metrics returns the server's Prometheus text (GET /metrics).
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	resp, err := c.send(ctx, http.MethodGet, "/metrics", nil, nil, "text/plain")
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer discard(resp)
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONAnswer))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return b, nil
}

// Buffers lists every buffer (GET /v1/buffers).
func (c *Client) Buffers(ctx context.Context) ([]Info, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/buffers", nil, nil, "application/json")
	if err != nil {
		return nil, fmt.Errorf("list buffers: %w", err)
	}
	var ans struct {
		Buffers []Info `json:"buffers"`
	}
	if err := readJSON(resp, &ans); err != nil {
		return nil, fmt.Errorf("list buffers: %w", err)
	}
	return ans.Buffers, nil
}

// CreateBuffer creates a buffer (PUT /v1/buffers/{name}). created is false
// when a buffer with an identical spec already exists; a different spec is
// ErrConflict.
func (c *Client) CreateBuffer(ctx context.Context, name string, spec *Spec) (info Info, created bool, err error) {
	if spec == nil {
		return Info{}, false, fmt.Errorf("create buffer %s: nil spec", name)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return Info{}, false, fmt.Errorf("create buffer %s: %w", name, err)
	}
	return c.CreateBufferJSON(ctx, name, raw)
}

// CreateBufferJSON is CreateBuffer with the spec as JSON, sent as given
// (e.g. read from a file).
func (c *Client) CreateBufferJSON(ctx context.Context, name string, spec json.RawMessage) (info Info, created bool, err error) {
	path, err := bufferPath(name, "")
	if err != nil {
		return Info{}, false, fmt.Errorf("create buffer: %w", err)
	}
	resp, err := c.send(ctx, http.MethodPut, path, nil, &body{contentType: "application/json", parts: [][]byte{spec}}, "application/json")
	if err != nil {
		return Info{}, false, fmt.Errorf("create buffer %s: %w", name, err)
	}
	created = resp.StatusCode == http.StatusCreated
	if err := readJSON(resp, &info); err != nil {
		return Info{}, false, fmt.Errorf("create buffer %s: %w", name, err)
	}
	return info, created, nil
}

// Info returns a buffer's state (GET /v1/buffers/{name}).
func (c *Client) Info(ctx context.Context, name string) (Info, error) {
	return c.info(ctx, name, nil)
}

// InfoForSlices is Info with Sampling.Slices: the trajectories the slice
// sampler draws among for slices of sliceLen rows.
func (c *Client) InfoForSlices(ctx context.Context, name string, sliceLen int) (Info, error) {
	return c.info(ctx, name, url.Values{"slice_len": {strconv.Itoa(sliceLen)}})
}

func (c *Client) info(ctx context.Context, name string, query url.Values) (Info, error) {
	path, err := bufferPath(name, "")
	if err != nil {
		return Info{}, fmt.Errorf("info: %w", err)
	}
	resp, err := c.send(ctx, http.MethodGet, path, query, nil, "application/json")
	if err != nil {
		return Info{}, fmt.Errorf("info %s: %w", name, err)
	}
	var info Info
	if err := readJSON(resp, &info); err != nil {
		return Info{}, fmt.Errorf("info %s: %w", name, err)
	}
	return info, nil
}

// DeleteBuffer deletes a buffer and its rows (DELETE /v1/buffers/{name}).
func (c *Client) DeleteBuffer(ctx context.Context, name string) error {
	path, err := bufferPath(name, "")
	if err != nil {
		return fmt.Errorf("delete buffer: %w", err)
	}
	resp, err := c.send(ctx, http.MethodDelete, path, nil, nil, "application/json")
	if err != nil {
		return fmt.Errorf("delete buffer %s: %w", name, err)
	}
	discard(resp)
	return nil
}

// SetRateLimit replaces a buffer's rate limit (PUT
// /v1/buffers/{name}/rate_limit; nil removes it) and returns the limiter's
// state after the change, nil once removed. The change is durable and
// judges waiting requests again; the counters restart from the buffer's
// size (docs/flow-control.md).
func (c *Client) SetRateLimit(ctx context.Context, name string, limit *RateLimit) (*ratelimit.State, error) {
	path, err := bufferPath(name, "/rate_limit")
	if err != nil {
		return nil, fmt.Errorf("set rate limit: %w", err)
	}
	b, err := jsonBody(limit)
	if err != nil {
		return nil, fmt.Errorf("set rate limit %s: %w", name, err)
	}
	resp, err := c.send(ctx, http.MethodPut, path, nil, b, "application/json")
	if err != nil {
		return nil, fmt.Errorf("set rate limit %s: %w", name, err)
	}
	var ans struct {
		RateLimit *ratelimit.State `json:"rate_limit"`
	}
	if err := readJSON(resp, &ans); err != nil {
		return nil, fmt.Errorf("set rate limit %s: %w", name, err)
	}
	return ans.RateLimit, nil
}

// Extend appends rows to a buffer (POST /v1/buffers/{name}/extend), sent as
// safetensors: every field of the spec as [N, shape...], optionally a
// tensor named "env" (int32 or int64 [N]) giving each row's env, and for
// compact_obs buffers the final observations next.<k> of done rows. stream
// names the writer whose open trajectories continue across requests; ""
// makes the request its own stream.
func (c *Client) Extend(ctx context.Context, name, stream string, tensors []codec.Tensor) (ExtendResult, error) {
	return c.ExtendWithOptions(ctx, name, stream, tensors, nil)
}

// ExtendOptions are the optional settings of ExtendWithOptions. The zero
// value is Extend's behaviour.
type ExtendOptions struct {
	// TimeoutMS is how long the server may hold the request waiting for the
	// buffer's rate limiter (0: answer at once); the server caps it at its
	// --max-wait.
	TimeoutMS int64
}

// ExtendWithOptions is Extend with options: a wait for the buffer's rate
// limiter. An extend the limiter does not admit in time is ErrRateLimited
// (retried per Options.RetryRateLimited) and writes nothing.
func (c *Client) ExtendWithOptions(ctx context.Context, name, stream string, tensors []codec.Tensor, opts *ExtendOptions) (ExtendResult, error) {
	path, err := bufferPath(name, "/extend")
	if err != nil {
		return ExtendResult{}, fmt.Errorf("extend: %w", err)
	}
	b, err := safetensorsBody(tensors)
	if err != nil {
		return ExtendResult{}, fmt.Errorf("extend %s: %w", name, err)
	}
	var q url.Values
	if stream != "" {
		q = url.Values{"stream": {stream}}
	}
	if opts != nil && opts.TimeoutMS != 0 {
		if q == nil {
			q = url.Values{}
		}
		q.Set("timeout_ms", strconv.FormatInt(opts.TimeoutMS, 10))
	}
	resp, err := c.sendRetrying(ctx, http.MethodPost, path, q, b, "application/json")
	if err != nil {
		return ExtendResult{}, fmt.Errorf("extend %s: %w", name, err)
	}
	var res ExtendResult
	if err := readJSON(resp, &res); err != nil {
		return ExtendResult{}, fmt.Errorf("extend %s: %w", name, err)
	}
	return res, nil
}

// Sample draws a batch (POST /v1/buffers/{name}/sample). The answer always
// holds seq, traj_id and step besides the requested keys; see
// SampleRequest. A request the current data cannot satisfy yet is
// ErrNotReady (see RetryAfter and SampleRequest.TimeoutMS).
func (c *Client) Sample(ctx context.Context, name string, req *SampleRequest) (*Batch, error) {
	path, err := bufferPath(name, "/sample")
	if err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	if req == nil {
		req = &SampleRequest{}
	}
	b, err := jsonBody(req)
	if err != nil {
		return nil, fmt.Errorf("sample %s: %w", name, err)
	}
	resp, err := c.sendRetrying(ctx, http.MethodPost, path, nil, b, acceptTensors)
	if err != nil {
		return nil, fmt.Errorf("sample %s: %w", name, err)
	}
	batch, err := c.readTensors(resp)
	if err != nil {
		return nil, fmt.Errorf("sample %s: %w", name, err)
	}
	return batch, nil
}

// UpdatePriorities sets the priorities of rows by seq (POST
// /v1/buffers/{name}/priorities). Rows no longer live are counted as stale
// and left alone.
func (c *Client) UpdatePriorities(ctx context.Context, name string, seq []int64, prio []float64) (updated, stale int, err error) {
	path, err := bufferPath(name, "/priorities")
	if err != nil {
		return 0, 0, fmt.Errorf("update priorities: %w", err)
	}
	if len(seq) != len(prio) {
		return 0, 0, fmt.Errorf("update priorities %s: %d priorities for %d seqs", name, len(prio), len(seq))
	}
	// codec's JSON arrays carry NaN and infinities as strings, so the
	// server (not encoding/json) names a bad priority.
	out := []byte(`{"seq":`)
	st := NewTensor("seq", nil, seq)
	pt := NewTensor("priority", nil, prio)
	if out, err = codec.AppendJSONTensor(out, &st); err != nil {
		return 0, 0, fmt.Errorf("update priorities %s: %w", name, err)
	}
	out = append(out, `,"priority":`...)
	if out, err = codec.AppendJSONTensor(out, &pt); err != nil {
		return 0, 0, fmt.Errorf("update priorities %s: %w", name, err)
	}
	out = append(out, '}')
	resp, err := c.send(ctx, http.MethodPost, path, nil, &body{contentType: "application/json", parts: [][]byte{out}}, "application/json")
	if err != nil {
		return 0, 0, fmt.Errorf("update priorities %s: %w", name, err)
	}
	if updated, stale, err = readUpdateCounts(resp); err != nil {
		return 0, 0, fmt.Errorf("update priorities %s: %w", name, err)
	}
	return updated, stale, nil
}

// UpdateFields sets mutable fields of live rows by seq (POST
// /v1/buffers/{name}/update): each tensor is a field the buffer's spec
// marks mutable, [len(seq), shape...] in its dtype (e.g. recurrent states a
// learner recomputed). Rows overwritten since they were sampled are skipped
// and counted as stale; with duplicate seqs the last value wins.
func (c *Client) UpdateFields(ctx context.Context, name string, seq []int64, fields ...codec.Tensor) (updated, stale int, err error) {
	path, err := bufferPath(name, "/update")
	if err != nil {
		return 0, 0, fmt.Errorf("update: %w", err)
	}
	tensors := append([]codec.Tensor{NewTensor("seq", nil, seq)}, fields...)
	b, err := safetensorsBody(tensors)
	if err != nil {
		return 0, 0, fmt.Errorf("update %s: %w", name, err)
	}
	resp, err := c.send(ctx, http.MethodPost, path, nil, b, "application/json")
	if err != nil {
		return 0, 0, fmt.Errorf("update %s: %w", name, err)
	}
	if updated, stale, err = readUpdateCounts(resp); err != nil {
		return 0, 0, fmt.Errorf("update %s: %w", name, err)
	}
	return updated, stale, nil
}

// readUpdateCounts reads the answer of a priority or field update.
func readUpdateCounts(resp *http.Response) (updated, stale int, err error) {
	var ans struct {
		Updated int `json:"updated"`
		Stale   int `json:"stale"`
	}
	err = readJSON(resp, &ans)
	return ans.Updated, ans.Stale, err
}

// Rows reads live rows from fromSeq on, in seq order (GET
// /v1/buffers/{name}/rows): every stored field as [n, shape...] plus int64
// seq, traj_id, step, prev_seq and next_seq (-1 = none). The answer may
// hold fewer than count rows; continue from the last seq + 1. count <= 0
// means the server's default (100).
func (c *Client) Rows(ctx context.Context, name string, fromSeq int64, count int) (*Batch, error) {
	path, err := bufferPath(name, "/rows")
	if err != nil {
		return nil, fmt.Errorf("rows: %w", err)
	}
	q := url.Values{"from_seq": {strconv.FormatInt(fromSeq, 10)}}
	if count > 0 {
		q.Set("count", strconv.Itoa(count))
	}
	resp, err := c.send(ctx, http.MethodGet, path, q, nil, acceptTensors)
	if err != nil {
		return nil, fmt.Errorf("rows %s: %w", name, err)
	}
	batch, err := c.readTensors(resp)
	if err != nil {
		return nil, fmt.Errorf("rows %s: %w", name, err)
	}
	return batch, nil
}

// CloseStream closes the open trajectories of a stream (DELETE
// /v1/buffers/{name}/streams/{stream}) and returns how many it closed. The
// next extend on that stream starts new trajectories.
func (c *Client) CloseStream(ctx context.Context, name, stream string) (int, error) {
	seg, err := segment("stream", stream)
	if err != nil {
		return 0, fmt.Errorf("close stream: %w", err)
	}
	path, err := bufferPath(name, "/streams/"+seg)
	if err != nil {
		return 0, fmt.Errorf("close stream: %w", err)
	}
	resp, err := c.send(ctx, http.MethodDelete, path, nil, nil, "application/json")
	if err != nil {
		return 0, fmt.Errorf("close stream %s/%s: %w", name, stream, err)
	}
	var ans struct {
		Closed int `json:"closed"`
	}
	if err := readJSON(resp, &ans); err != nil {
		return 0, fmt.Errorf("close stream %s/%s: %w", name, stream, err)
	}
	return ans.Closed, nil
}

// Collector returns a server-run collector's live state (GET
// /v1/collectors/{name}; ErrNotFound when the server runs none of that
// name).
func (c *Client) Collector(ctx context.Context, name string) (CollectorInfo, error) {
	seg, err := segment("collector", name)
	if err != nil {
		return CollectorInfo{}, fmt.Errorf("collector: %w", err)
	}
	resp, err := c.send(ctx, http.MethodGet, "/v1/collectors/"+seg, nil, nil, "application/json")
	if err != nil {
		return CollectorInfo{}, fmt.Errorf("collector %s: %w", name, err)
	}
	var info CollectorInfo
	if err := readJSON(resp, &info); err != nil {
		return CollectorInfo{}, fmt.Errorf("collector %s: %w", name, err)
	}
	return info, nil
}

// SetWeights replaces the policy weights of a collector the server runs
// (PUT /v1/collectors/{collector}/weights), e.g. for "demo": float32 "w"
// [4, 2] and "b" [2]. Unknown collectors are ErrNotFound, tensors of the
// wrong name or shape ErrBadRequest.
func (c *Client) SetWeights(ctx context.Context, collector string, tensors []codec.Tensor) error {
	seg, err := segment("collector", collector)
	if err != nil {
		return fmt.Errorf("set weights: %w", err)
	}
	b, err := safetensorsBody(tensors)
	if err != nil {
		return fmt.Errorf("set weights %s: %w", collector, err)
	}
	resp, err := c.send(ctx, http.MethodPut, "/v1/collectors/"+seg+"/weights", nil, b, "application/json")
	if err != nil {
		return fmt.Errorf("set weights %s: %w", collector, err)
	}
	discard(resp)
	return nil
}

// CheckpointResult says what a hot checkpoint holds (see
// storage.CheckpointResult): the rows below WriteCount from FirstSeq on,
// less the Overwritten ones writers took before the copy reached them.
type CheckpointResult struct {
	Buffer      string  `json:"buffer"`
	Dir         string  `json:"dir"`
	WriteCount  int64   `json:"write_count"`
	FirstSeq    int64   `json:"first_seq"`
	Rows        int64   `json:"rows"`
	Overwritten int64   `json:"overwritten"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
}

// Checkpoint asks the server for a hot checkpoint of a buffer into dir,
// under its --checkpoint-root (POST /v1/buffers/{name}/checkpoint), and
// waits for it; progress, when set, is called as the copy goes on with the
// bytes done and in all. Cancelling ctx cancels the checkpoint.
func (c *Client) Checkpoint(ctx context.Context, name, dir string, progress func(done, total int64)) (CheckpointResult, error) {
	path, err := bufferPath(name, "/checkpoint")
	if err != nil {
		return CheckpointResult{}, fmt.Errorf("checkpoint: %w", err)
	}
	b, err := jsonBody(map[string]string{"dir": dir})
	if err != nil {
		return CheckpointResult{}, err
	}
	resp, err := c.send(ctx, http.MethodPost, path, nil, b, "application/x-ndjson")
	if err != nil {
		return CheckpointResult{}, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	defer discard(resp)
	dec := json.NewDecoder(resp.Body)
	for {
		var line struct {
			Done   int64             `json:"done_bytes"`
			Total  int64             `json:"total_bytes"`
			Result *CheckpointResult `json:"result"`
			Error  string            `json:"error"`
			Code   string            `json:"code"`
		}
		if err := dec.Decode(&line); err != nil {
			return CheckpointResult{}, fmt.Errorf("checkpoint %s: the answer ended before the result: %w", name, err)
		}
		switch {
		case line.Result != nil:
			return *line.Result, nil
		case line.Error != "":
			return CheckpointResult{}, fmt.Errorf("checkpoint %s: %w", name, &APIError{Status: http.StatusInternalServerError, Code: line.Code, Message: line.Error})
		case progress != nil:
			progress(line.Done, line.Total)
		}
	}
}
