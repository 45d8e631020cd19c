package server_test

// Contract tests: every endpoint of a real server, every status the HTTP
// contract lists, each request and answer checked against docs/openapi.yaml
// with kin-openapi. A server change that the spec does not describe (a new
// status, a renamed key, a new Info field) fails here, and so does a spec
// change the server does not follow.
//
//	go test ./server -run 'TestContract' -v

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	legacyrouter "github.com/getkin/kin-openapi/routers/legacy"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/server"
	"github.com/rbdb/rbd/storage"
)

const (
	ctSpecPath = "../docs/openapi.yaml"
	ctToken    = "contract-token"
	ctMaxBody  = 1 << 20 // small, so that 413 costs little
	ctMaxResp  = 1 << 20
)

// ctCartPole is a compact CartPole memory buffer with priorities.
const ctCartPole = `{"capacity": 64, "storage": "memory",
 "fields": {"observation": {"dtype": "float32", "shape": [4]},
            "action": {"dtype": "int64", "shape": []},
            "next.reward": {"dtype": "float32", "shape": []},
            "next.done": {"dtype": "bool", "shape": []},
            "next.terminated": {"dtype": "bool", "shape": []},
            "next.truncated": {"dtype": "bool", "shape": []}},
 "compact_obs": true, "obs_keys": ["observation"],
 "priority": {"alpha": 0.6, "eps": 1e-6}}`

// ctPlain is a non-compact memmap buffer without priorities that stays
// empty (for not_ready and for prioritised requests it cannot serve).
const ctPlain = `{"capacity": 16, "storage": "memmap", "durability": "fsync",
 "fields": {"observation": {"dtype": "uint8", "shape": [2, 2]},
            "next.observation": {"dtype": "uint8", "shape": [2, 2]},
            "next.done": {"dtype": "bool"}}}`

// ctRecurrent is a buffer with a mutable field (recurrent states).
const ctRecurrent = `{"capacity": 8, "storage": "memmap", "durability": "fsync",
 "fields": {"observation": {"dtype": "float32", "shape": [2]},
            "h": {"dtype": "float32", "shape": [2], "mutable": true},
            "next.done": {"dtype": "bool"}}}`

var ctDecodersOnce sync.Once

// ctRegisterDecoders teaches kin-openapi that control bodies sent as form
// data or plain text (curl -d) are JSON when the schema says object, as
// the server reads them. (Binary bodies bypass registered decoders in
// kin-openapi; ctValidate checks them as safetensors itself.) The registry
// is global; only this package's tests use it.
func ctRegisterDecoders() {
	ctDecodersOnce.Do(func() {
		jsonish := func(body io.Reader, h http.Header, s *openapi3.SchemaRef, enc openapi3filter.EncodingFn) (any, error) {
			if s != nil && s.Value != nil && s.Value.Type.Is("object") {
				return openapi3filter.JSONBodyDecoder(body, h, s, enc)
			}
			return openapi3filter.PlainBodyDecoder(body, h, s, enc)
		}
		openapi3filter.RegisterBodyDecoder("application/x-www-form-urlencoded", jsonish)
		openapi3filter.RegisterBodyDecoder("text/plain", jsonish)
		// Sample streams: every frame must be safetensors or, last, an
		// error object with its status.
		openapi3filter.RegisterBodyDecoder("application/vnd.rbd.sample-stream", func(body io.Reader, h http.Header, s *openapi3.SchemaRef, enc openapi3filter.EncodingFn) (any, error) {
			data, err := io.ReadAll(body)
			if err != nil {
				return nil, err
			}
			for rest := data; len(rest) > 0; {
				if len(rest) < 8 {
					return nil, fmt.Errorf("stream: %d bytes left, less than a length word", len(rest))
				}
				n := binary.LittleEndian.Uint64(rest)
				size := n &^ (1 << 63)
				if uint64(len(rest)-8) < size {
					return nil, fmt.Errorf("stream: a %d-byte frame with %d bytes left", size, len(rest)-8)
				}
				frame := rest[8 : 8+size]
				rest = rest[8+size:]
				if n&(1<<63) == 0 {
					if _, _, err := codec.DecodeSafetensors(frame); err != nil {
						return nil, fmt.Errorf("stream: batch frame: %w", err)
					}
					continue
				}
				var e struct {
					Error  string `json:"error"`
					Status int    `json:"status"`
				}
				if err := json.Unmarshal(frame, &e); err != nil || e.Error == "" || e.Status < 400 || len(rest) > 0 {
					return nil, fmt.Errorf("stream: error frame %q (%v) must be a JSON error with a status, and last", frame, err)
				}
			}
			return string(data), nil
		})
		// NDJSON progress streams (checkpoint): every line must be a JSON
		// object; the spec types the stream as a string.
		openapi3filter.RegisterBodyDecoder("application/x-ndjson", func(body io.Reader, h http.Header, s *openapi3.SchemaRef, enc openapi3filter.EncodingFn) (any, error) {
			data, err := io.ReadAll(body)
			if err != nil {
				return nil, err
			}
			for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
				var obj map[string]any
				if err := json.Unmarshal(line, &obj); err != nil {
					return nil, fmt.Errorf("NDJSON line %q: %w", line, err)
				}
			}
			return string(data), nil
		})
	})
}

// ctSafetensorsErr checks a body the spec declares as safetensors (a
// binary string schema, which kin-openapi does not look into).
func ctSafetensorsErr(content openapi3.Content, header http.Header, body []byte) error {
	mt, _, _ := mime.ParseMediaType(header.Get("Content-Type"))
	m := content.Get(mt)
	if m == nil || m.Schema == nil || m.Schema.Value == nil || m.Schema.Value.Format != "binary" {
		return nil
	}
	if _, _, err := codec.DecodeSafetensors(body); err != nil {
		return fmt.Errorf("%s body is not safetensors: %w", mt, err)
	}
	return nil
}

// ctLoad loads and validates the spec and returns it with a router. The
// servers list is dropped so that routes match httptest's random port.
func ctLoad(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	ctRegisterDecoders()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(ctSpecPath)
	if err != nil {
		t.Fatalf("load %s: %v", ctSpecPath, err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", ctSpecPath, err)
	}
	doc.Servers = nil
	router, err := legacyrouter.NewRouter(doc)
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	return doc, router
}

// ctCase is one request and what the server must answer.
type ctCase struct {
	name   string
	shut   bool // send to the server that is shutting down
	method string
	path   string // with query
	ctype  string
	accept string
	auth   string // Authorization header; "" means the right bearer token, "-" none
	body   []byte
	want   int
	code   string // the error's "code", if any
	// invalid marks requests the spec itself rejects (bad name, unknown
	// key, wrong content type, no token...): request validation must fail
	// for them, and pass for every other request.
	invalid bool
}

// ctExchange is a request as sent and the answer as received.
type ctExchange struct {
	req    *http.Request // a fresh copy for validation
	body   []byte
	status int
	header http.Header
	answer []byte
}

func ctSend(t *testing.T, base string, c ctCase) ctExchange {
	t.Helper()
	mk := func() *http.Request {
		req, err := http.NewRequestWithContext(t.Context(), c.method, base+c.path, bytes.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.body == nil {
			req.Body = http.NoBody
		}
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		if c.accept != "" {
			req.Header.Set("Accept", c.accept)
		}
		switch c.auth {
		case "":
			req.Header.Set("Authorization", "Bearer "+ctToken)
		case "-":
		default:
			req.Header.Set("Authorization", c.auth)
		}
		return req
	}
	resp, err := http.DefaultClient.Do(mk())
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read answer: %v", c.method, c.path, err)
	}
	return ctExchange{req: mk(), body: c.body, status: resp.StatusCode, header: resp.Header, answer: answer}
}

// ctAuth accepts exactly the token the test servers run with.
func ctAuth(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if in.SecuritySchemeName != "bearerAuth" {
		return fmt.Errorf("unknown security scheme %q", in.SecuritySchemeName)
	}
	if in.RequestValidationInput.Request.Header.Get("Authorization") != "Bearer "+ctToken {
		return errors.New("missing or wrong bearer token")
	}
	return nil
}

// ctValidate checks one exchange against the spec: the request (reqErr)
// and the answer (respErr). Statuses the operation does not list are
// errors.
func ctValidate(t *testing.T, router routers.Router, x ctExchange) (route *routers.Route, reqErr, respErr error) {
	t.Helper()
	req := x.req.Clone(x.req.Context())
	req.Body = io.NopCloser(bytes.NewReader(x.body))
	route, params, err := router.FindRoute(req)
	if err != nil {
		return nil, nil, fmt.Errorf("no route in the spec for %s %s: %w", req.Method, req.URL.Path, err)
	}
	in := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			AuthenticationFunc: ctAuth,
			MultiError:         true,
		},
	}
	reqErr = openapi3filter.ValidateRequest(req.Context(), in)
	if rb := route.Operation.RequestBody; reqErr == nil && rb != nil && rb.Value != nil {
		reqErr = ctSafetensorsErr(rb.Value.Content, x.req.Header, x.body)
	}
	respErr = openapi3filter.ValidateResponse(req.Context(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 x.status,
		Header:                 x.header,
		Body:                   io.NopCloser(bytes.NewReader(x.answer)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
	if r := route.Operation.Responses.Status(x.status); respErr == nil && r != nil && r.Value != nil {
		respErr = ctSafetensorsErr(r.Value.Content, x.header, x.answer)
	}
	return route, reqErr, respErr
}

// ctWeights stands in for the demo collector: "demo" takes float32 w
// [4, 2] and b [2] and reports a state.
type ctWeights struct{}

func (ctWeights) CollectorInfo(collector string) (server.CollectorInfo, error) {
	if collector != "demo" {
		return server.CollectorInfo{}, fmt.Errorf("collector %q: %w", collector, storage.ErrNotFound)
	}
	return server.CollectorInfo{Name: "demo", Env: "cartpole", Envs: 8, Buffer: "demo", Policy: "mlp", Hidden: 64,
		Epsilon: 0.1, WeightsVersion: 3, Frames: 2560, Episodes: 40, MeanEpisodeReturn: 21.5, MeanEpisodeLength: 21.5,
		FramesPerSecond: 5000}, nil
}

func (ctWeights) Collectors() []string { return []string{"demo"} }

func (ctWeights) CollectorActivity(collector string, since int64) (server.CollectorActivity, error) {
	if collector != "demo" {
		return server.CollectorActivity{}, fmt.Errorf("collector %q: %w", collector, storage.ErrNotFound)
	}
	return server.CollectorActivity{T: []int64{since + 1, since + 2}, Frames: []float64{256, 512}, Episodes: []float64{10, 22},
		MeanEpisodeReturn: []float64{9.5, 11}, MeanEpisodeLength: []float64{9.5, 11}}, nil
}

func (ctWeights) SetWeights(collector string, tensors map[string][]float32, shapes map[string][]int) error {
	if collector != "demo" {
		return fmt.Errorf("collector %q: %w", collector, storage.ErrNotFound)
	}
	if len(tensors) != 2 || !slices.Equal(shapes["w"], []int{4, 2}) || !slices.Equal(shapes["b"], []int{2}) {
		return fmt.Errorf("weights: want float32 w [4 2] and b [2]: %w", storage.ErrInvalidBatch)
	}
	return nil
}

// ctServers runs one server with a token, a small body limit and a weight
// setter, and a second one over the same store that is shutting down.
func ctServers(t *testing.T) (live, shut *httptest.Server) {
	t.Helper()
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := server.New(db, &server.Options{Token: ctToken, MaxBody: ctMaxBody, MaxResponse: ctMaxResp, Weights: ctWeights{},
		CheckpointRoot: t.TempDir()})
	live = httptest.NewServer(s.Handler())
	down := server.New(db, &server.Options{Token: ctToken, MaxBody: ctMaxBody})
	down.BeginShutdown()
	shut = httptest.NewServer(down.Handler())
	t.Cleanup(func() {
		live.Close()
		shut.Close()
		db.Close()
	})
	return live, shut
}

func ctF32(vs ...float32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func ctI64(vs ...int64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return b
}

func ctSafetensors(t *testing.T, ts ...codec.Tensor) []byte {
	t.Helper()
	b, err := codec.EncodeSafetensors(ts, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ctRows is n CartPole rows as safetensors; the last row is done and its
// final observation is sent (one per done row).
func ctRows(t *testing.T, n int) []byte {
	t.Helper()
	obs := make([]float32, 4*n)
	for i := range obs {
		obs[i] = float32(i) / 8
	}
	done := make([]byte, n)
	done[n-1] = 1
	return ctSafetensors(t,
		codec.Tensor{Name: "observation", DType: "float32", Shape: []int{n, 4}, Data: ctF32(obs...)},
		codec.Tensor{Name: "action", DType: "int64", Shape: []int{n}, Data: make([]byte, 8*n)},
		codec.Tensor{Name: "next.reward", DType: "float32", Shape: []int{n}, Data: bytes.Repeat(ctF32(1), n)},
		codec.Tensor{Name: "next.done", DType: "bool", Shape: []int{n}, Data: done},
		codec.Tensor{Name: "next.terminated", DType: "bool", Shape: []int{n}, Data: done},
		codec.Tensor{Name: "next.truncated", DType: "bool", Shape: []int{n}, Data: make([]byte, n)},
		codec.Tensor{Name: "next.observation", DType: "float32", Shape: []int{1, 4}, Data: ctF32(9, 9, 9, 9)},
	)
}

// ctPad makes a JSON body larger than the server's limit while keeping it
// valid JSON (and valid against the schema).
func ctPad(js string) []byte {
	return []byte(js[:len(js)-1] + strings.Repeat(" ", ctMaxBody) + "}")
}

func ctCases(t *testing.T) []ctCase {
	const (
		js   = "application/json"
		bin  = "application/octet-stream"
		st   = "application/vnd.safetensors"
		form = "application/x-www-form-urlencoded"
	)
	extendJSON := `{"observation": [[0,0,0,0],[1,1,1,1],[2,2,2,2]], "action": [0,1,0], "next.reward": [1,1,"NaN"],
	 "next.done": [false,false,1], "next.terminated": [false,false,true], "next.truncated": [0,0,0],
	 "next.observation": [[3,3,3,3]], "env": [0,0,0]}`
	everyKey := `{"batch_size": 4, "sampler": "prioritized", "seed": 7, "keys": ["observation", "action", "next.reward"],
	 "next_state": true, "n_step": {"n": 2, "gamma": 0.99}, "beta": 0.5, "include_incomplete": true,
	 "fill": "nan", "timeout_ms": 0}`
	sliceKeys := `{"sampler": "slice", "num_slices": 2, "slice_len": 3, "batch_size": 6, "strict_length": false,
	 "seed": -3, "keys": null}`
	wrKeys := `{"sampler": "without_replacement", "batch_size": 5, "consumer": "learner-0", "drop_last": true,
	 "seed": 18446744073709551615}`
	weights := ctSafetensors(t,
		codec.Tensor{Name: "w", DType: "float32", Shape: []int{4, 2}, Data: ctF32(1, 2, 3, 4, 5, 6, 7, 8)},
		codec.Tensor{Name: "b", DType: "float32", Shape: []int{2}, Data: ctF32(0, 0)})
	badWeights := ctSafetensors(t, codec.Tensor{Name: "w", DType: "float32", Shape: []int{2}, Data: ctF32(1, 2)})
	// 70,000 rows of observations: valid safetensors, over the 1 MiB limit.
	big := ctSafetensors(t, codec.Tensor{Name: "observation", DType: "float32", Shape: []int{70000, 4}, Data: make([]byte, 70000*16)})

	return []ctCase{
		// service
		{name: "health", method: "GET", path: "/v1/health", auth: "-", want: 200},
		{name: "health while shutting down", shut: true, method: "GET", path: "/v1/health", auth: "-", want: 200},
		{name: "metrics", method: "GET", path: "/metrics", want: 200},
		{name: "metrics without token", method: "GET", path: "/metrics", auth: "-", want: 401, invalid: true},
		{name: "list empty", method: "GET", path: "/v1/buffers", want: 200},
		{name: "list with wrong token", method: "GET", path: "/v1/buffers", auth: "Bearer nope", want: 401, invalid: true},

		// create
		{name: "create", method: "PUT", path: "/v1/buffers/cp", ctype: js, body: []byte(ctCartPole), want: 201},
		{name: "create identical (curl -d)", method: "PUT", path: "/v1/buffers/cp", ctype: form, body: []byte(ctCartPole), want: 200},
		{name: "create conflicting", method: "PUT", path: "/v1/buffers/cp", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"capacity": 64`, `"capacity": 65`, 1)), want: 409},
		{name: "create plain", method: "PUT", path: "/v1/buffers/plain.v1", ctype: "text/plain", body: []byte(ctPlain), want: 201},
		{name: "create unknown dtype", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"int64"`, `"int65"`, 1)), want: 400, invalid: true},
		{name: "create unknown key", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(`{"capacity": 1, "colour": "red", "fields": {"next.done": {"dtype": "bool"}}}`), want: 400, invalid: true},
		{name: "create compact declaring next.observation", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"action"`, `"next.observation": {"dtype": "float32", "shape": [4]}, "action"`, 1)), want: 400},
		{name: "create durability on memory", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memory", "durability": "none"`, 1)), want: 400},
		{name: "create with run records", method: "PUT", path: "/v1/buffers/runs", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memory", "row_meta": "runs"`, 1)), want: 201},
		{name: "create run records on memmap", method: "PUT", path: "/v1/buffers/runs_memmap", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memmap", "row_meta": "runs"`, 1)), want: 201},
		// A memmap spec without row_meta gets "blocks" (from 1,024 rows, not
		// fsync: defaultMemmapRowMeta); asked again without it, or with
		// "blocks", the buffer is the same; with "runs", it is not. A
		// smaller one gets "runs".
		{name: "create memmap, row_meta left out", method: "PUT", path: "/v1/buffers/mm_default", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"capacity": 64, "storage": "memory"`, `"capacity": 2048, "storage": "memmap"`, 1)), want: 201},
		{name: "create memmap again, row_meta left out", method: "PUT", path: "/v1/buffers/mm_default", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"capacity": 64, "storage": "memory"`, `"capacity": 2048, "storage": "memmap"`, 1)), want: 200},
		{name: "create memmap again, row_meta blocks", method: "PUT", path: "/v1/buffers/mm_default", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"capacity": 64, "storage": "memory"`, `"capacity": 2048, "storage": "memmap", "row_meta": "blocks"`, 1)), want: 200},
		{name: "create memmap again, row_meta runs", method: "PUT", path: "/v1/buffers/mm_default", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"capacity": 64, "storage": "memory"`, `"capacity": 2048, "storage": "memmap", "row_meta": "runs"`, 1)), want: 409},
		{name: "create small memmap, row_meta left out", method: "PUT", path: "/v1/buffers/mm_small", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memmap"`, 1)), want: 201},
		{name: "create small memmap again, row_meta runs", method: "PUT", path: "/v1/buffers/mm_small", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memmap", "row_meta": "runs"`, 1)), want: 200},
		{name: "create small memmap again, row_meta blocks", method: "PUT", path: "/v1/buffers/mm_small", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memmap", "row_meta": "blocks"`, 1)), want: 409},
		{name: "create blocks on memory", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memory", "row_meta": "blocks"`, 1)), want: 400},
		{name: "create run records on compressed", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "compressed", "row_meta": "runs"`, 1)), want: 400},
		{name: "create strided runs on compressed", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "compressed", "row_meta": "strided"`, 1)), want: 400},
		{name: "create strided runs on memmap", method: "PUT", path: "/v1/buffers/mm_strided", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memmap", "row_meta": "strided"`, 1)), want: 201},
		{name: "create unknown row_meta", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctCartPole, `"storage": "memory"`, `"storage": "memory", "row_meta": "columns"`, 1)), want: 400, invalid: true},
		{name: "create name with ..", method: "PUT", path: "/v1/buffers/a..b", ctype: js, body: []byte(ctCartPole), want: 400, invalid: true},
		{name: "create name starting with -", method: "PUT", path: "/v1/buffers/-x", ctype: js, body: []byte(ctCartPole), want: 400, invalid: true},
		{name: "create as image", method: "PUT", path: "/v1/buffers/x", ctype: "image/png", body: []byte(ctCartPole), want: 415, invalid: true},
		{name: "create too large", method: "PUT", path: "/v1/buffers/x", ctype: js, body: ctPad(ctCartPole), want: 413},
		{name: "create without token", method: "PUT", path: "/v1/buffers/x", ctype: js, auth: "-", body: []byte(ctCartPole), want: 401, invalid: true},
		{name: "list", method: "GET", path: "/v1/buffers", want: 200},
		{name: "info", method: "GET", path: "/v1/buffers/cp", want: 200},
		{name: "info plain", method: "GET", path: "/v1/buffers/plain.v1", want: 200},
		{name: "info unknown", method: "GET", path: "/v1/buffers/nope", want: 404},
		{name: "info bad name", method: "GET", path: "/v1/buffers/-x", want: 400, invalid: true},

		// extend
		{name: "extend safetensors", method: "POST", path: "/v1/buffers/cp/extend?stream=actor-0", ctype: bin, body: ctRows(t, 5), want: 200},
		{name: "extend vnd.safetensors", method: "POST", path: "/v1/buffers/cp/extend?stream=actor-1", ctype: st, body: ctRows(t, 7), want: 200},
		{name: "extend JSON, no stream", method: "POST", path: "/v1/buffers/cp/extend", ctype: js, body: []byte(extendJSON), want: 200},
		{name: "extend JSON as form (curl -d)", method: "POST", path: "/v1/buffers/cp/extend?stream=actor-2", ctype: form, body: []byte(extendJSON), want: 200},
		{name: "extend open trajectory", method: "POST", path: "/v1/buffers/cp/extend?stream=open", ctype: js,
			body: []byte(`{"observation": [[5,5,5,5],[6,6,6,6]], "action": [1,1], "next.reward": [0,0], "next.done": [false,false],
			 "next.terminated": [false,false], "next.truncated": [false,false]}`), want: 200},
		{name: "extend missing field", method: "POST", path: "/v1/buffers/cp/extend", ctype: js,
			body: []byte(`{"observation": [[0,0,0,0]], "next.done": [true]}`), want: 400},
		{name: "extend done differs from flags", method: "POST", path: "/v1/buffers/cp/extend", ctype: js,
			body: []byte(strings.Replace(extendJSON, `"next.terminated": [false,false,true]`, `"next.terminated": [false,false,false]`, 1)), want: 400},
		{name: "extend mis-shaped", method: "POST", path: "/v1/buffers/cp/extend", ctype: js,
			body: []byte(strings.Replace(extendJSON, `[2,2,2,2]]`, `[2,2,2]]`, 1)), want: 400},
		{name: "extend without next.done", method: "POST", path: "/v1/buffers/cp/extend", ctype: js,
			body: []byte(`{"observation": [[0,0,0,0]]}`), want: 400, invalid: true},
		{name: "extend garbage safetensors", method: "POST", path: "/v1/buffers/cp/extend", ctype: bin, body: []byte("garbage!"), want: 400, invalid: true},
		{name: "extend as image", method: "POST", path: "/v1/buffers/cp/extend", ctype: "image/png", body: ctRows(t, 1), want: 415, invalid: true},
		{name: "extend unknown buffer", method: "POST", path: "/v1/buffers/nope/extend", ctype: bin, body: ctRows(t, 1), want: 404},
		{name: "extend too large", method: "POST", path: "/v1/buffers/cp/extend", ctype: bin, body: big, want: 413},
		{name: "extend without token", method: "POST", path: "/v1/buffers/cp/extend", ctype: bin, auth: "-", body: ctRows(t, 1), want: 401, invalid: true},
		{name: "extend shutting down", shut: true, method: "POST", path: "/v1/buffers/cp/extend", ctype: bin, body: ctRows(t, 1), want: 503, code: "shutting_down"},

		// sample
		{name: "extend run records", method: "POST", path: "/v1/buffers/runs/extend?stream=actor-0", ctype: bin, body: ctRows(t, 5), want: 200},
		{name: "sample run records", method: "POST", path: "/v1/buffers/runs/sample", ctype: js, accept: js, body: []byte(`{"batch_size": 4, "seed": 1}`), want: 200},
		{name: "sample safetensors", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 8, "seed": 0}`), want: 200},
		{name: "sample Accept vnd.safetensors", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, accept: st, body: []byte(`{"batch_size": 2}`), want: 200},
		{name: "sample JSON, every key", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, accept: js, body: []byte(everyKey), want: 200},
		{name: "sample with return_prob JSON", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, accept: js, body: []byte(`{"batch_size": 4, "sampler": "prioritized", "return_prob": true}`), want: 200},
		{name: "sample with return_prob", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 4, "return_prob": true}`), want: 200},
		{name: "sample slices with return_prob", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, accept: js, body: []byte(`{"sampler": "slice", "num_slices": 2, "slice_len": 2, "strict_length": false, "return_prob": true}`), want: 200},
		{name: "sample prioritized slices with return_prob", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"sampler": "prioritized_slice", "num_slices": 2, "slice_len": 2, "return_prob": true}`), want: 400},
		{name: "sample slices JSON", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, accept: js, body: []byte(sliceKeys), want: 200},
		{name: "sample slices safetensors", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(sliceKeys), want: 200},
		{name: "sample without replacement JSON", method: "POST", path: "/v1/buffers/cp/sample", ctype: form, accept: js, body: []byte(wrKeys), want: 200},
		{name: "sample without replacement safetensors", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(wrKeys), want: 200},
		{name: "sample stream", method: "POST", path: "/v1/buffers/cp/sample?stream=1", ctype: js, body: []byte(`{"batch_size": 2, "seed": 3, "batches": 3, "depth": 1}`), want: 200},
		{name: "sample stream, every key", method: "POST", path: "/v1/buffers/cp/sample?stream=1", ctype: js, body: []byte(`{"batch_size": 5, "sampler": "without_replacement", "consumer": "stream", "batches": 2, "stop_at_epoch_end": true}`), want: 200},
		{name: "sample stream depth 0", method: "POST", path: "/v1/buffers/cp/sample?stream=1", ctype: js, body: []byte(`{"batch_size": 2, "depth": 0}`), want: 400, invalid: true},
		{name: "sample stream unknown transport", method: "POST", path: "/v1/buffers/cp/sample?stream=pigeon", ctype: js, body: []byte(`{"batch_size": 2}`), want: 400, invalid: true},
		{name: "sample stream keys without a stream", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 2, "batches": 2}`), want: 400},
		{name: "sample unknown sampler", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 1, "sampler": "bogus"}`), want: 400, invalid: true},
		{name: "sample unknown key", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 1, "colour": 1}`), want: 400, invalid: true},
		{name: "sample unknown field", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 1, "keys": ["nope"]}`), want: 400},
		{name: "sample batch of 0", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 0}`), want: 400},
		{name: "sample prioritized without priority", method: "POST", path: "/v1/buffers/plain.v1/sample", ctype: js,
			body: []byte(`{"batch_size": 1, "sampler": "prioritized"}`), want: 400},
		{name: "sample too large an answer", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 100000}`), want: 400},
		{name: "sample empty buffer", method: "POST", path: "/v1/buffers/plain.v1/sample", ctype: js, body: []byte(`{"batch_size": 1, "timeout_ms": 5}`), want: 503, code: "not_ready"},
		{name: "sample as safetensors body", method: "POST", path: "/v1/buffers/cp/sample", ctype: bin, body: ctRows(t, 1), want: 415, invalid: true},
		{name: "sample unknown buffer", method: "POST", path: "/v1/buffers/nope/sample", ctype: js, body: []byte(`{"batch_size": 1}`), want: 404},
		{name: "sample too large", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: ctPad(`{"batch_size": 1}`), want: 413},
		{name: "sample without token", method: "POST", path: "/v1/buffers/cp/sample", ctype: js, auth: "-", body: []byte(`{"batch_size": 1}`), want: 401, invalid: true},
		{name: "sample shutting down", shut: true, method: "POST", path: "/v1/buffers/cp/sample", ctype: js, body: []byte(`{"batch_size": 1}`), want: 503, code: "shutting_down"},

		// priorities
		{name: "priorities", method: "POST", path: "/v1/buffers/cp/priorities", ctype: js, body: []byte(`{"seq": [0, 1, 1000], "priority": [0.5, 2, 0]}`), want: 200},
		{name: "priorities NaN", method: "POST", path: "/v1/buffers/cp/priorities", ctype: js, body: []byte(`{"seq": [0], "priority": ["NaN"]}`), want: 400, invalid: true},
		{name: "priorities negative", method: "POST", path: "/v1/buffers/cp/priorities", ctype: js, body: []byte(`{"seq": [0], "priority": [-1]}`), want: 400, invalid: true},
		{name: "priorities lengths differ", method: "POST", path: "/v1/buffers/cp/priorities", ctype: js, body: []byte(`{"seq": [0, 1], "priority": [1]}`), want: 400},
		{name: "priorities without priority", method: "POST", path: "/v1/buffers/plain.v1/priorities", ctype: js, body: []byte(`{"seq": [0], "priority": [1]}`), want: 400},
		{name: "priorities as csv", method: "POST", path: "/v1/buffers/cp/priorities", ctype: "text/csv", body: []byte("0,1\n"), want: 415, invalid: true},
		{name: "priorities unknown buffer", method: "POST", path: "/v1/buffers/nope/priorities", ctype: js, body: []byte(`{"seq": [0], "priority": [1]}`), want: 404},
		{name: "priorities too large", method: "POST", path: "/v1/buffers/cp/priorities", ctype: js, body: ctPad(`{"seq": [0], "priority": [1]}`), want: 413},

		// updates of mutable fields
		{name: "create with a mutable field", method: "PUT", path: "/v1/buffers/rec", ctype: js, body: []byte(ctRecurrent), want: 201},
		{name: "create mutable episode flag", method: "PUT", path: "/v1/buffers/x", ctype: js,
			body: []byte(strings.Replace(ctRecurrent, `"next.done": {"dtype": "bool"}`, `"next.done": {"dtype": "bool", "mutable": true}`, 1)), want: 400},
		{name: "extend with a mutable field", method: "POST", path: "/v1/buffers/rec/extend", ctype: js,
			body: []byte(`{"observation": [[0,0],[1,1],[2,2]], "h": [[0,0],[1,1],[2,2]], "next.done": [false,false,true]}`), want: 200},
		{name: "update JSON", method: "POST", path: "/v1/buffers/rec/update", ctype: js,
			body: []byte(`{"seq": [1, 2, 99], "h": [[0.5,0.5],[2.5,2.5],[9,9]]}`), want: 200},
		{name: "update safetensors", method: "POST", path: "/v1/buffers/rec/update", ctype: st,
			body: ctSafetensors(t, codec.Tensor{Name: "seq", DType: "int64", Shape: []int{1}, Data: ctI64(0)},
				codec.Tensor{Name: "h", DType: "float32", Shape: []int{1, 2}, Data: ctF32(-1, -1)}), want: 200},
		{name: "update an immutable field", method: "POST", path: "/v1/buffers/rec/update", ctype: js,
			body: []byte(`{"seq": [0], "observation": [[1,1]]}`), want: 400},
		{name: "update without seq", method: "POST", path: "/v1/buffers/rec/update", ctype: js,
			body: []byte(`{"h": [[1,1]]}`), want: 400, invalid: true},
		{name: "update without fields", method: "POST", path: "/v1/buffers/rec/update", ctype: js,
			body: []byte(`{"seq": [0]}`), want: 400, invalid: true},
		{name: "update rows differ from seq", method: "POST", path: "/v1/buffers/rec/update", ctype: js,
			body: []byte(`{"seq": [0, 1], "h": [[1,1]]}`), want: 400},
		{name: "update wrong dtype", method: "POST", path: "/v1/buffers/rec/update", ctype: bin,
			body: ctSafetensors(t, codec.Tensor{Name: "seq", DType: "int64", Shape: []int{1}, Data: ctI64(0)},
				codec.Tensor{Name: "h", DType: "int64", Shape: []int{1, 2}, Data: ctI64(1, 1)}), want: 400},
		{name: "update as csv", method: "POST", path: "/v1/buffers/rec/update", ctype: "text/csv", body: []byte("0,1\n"), want: 415, invalid: true},
		{name: "update unknown buffer", method: "POST", path: "/v1/buffers/nope/update", ctype: js, body: []byte(`{"seq": [0], "h": [[1,1]]}`), want: 404},
		{name: "update too large", method: "POST", path: "/v1/buffers/rec/update", ctype: js, body: ctPad(`{"seq": [0], "h": [[1,1]]}`), want: 413},
		{name: "update without token", method: "POST", path: "/v1/buffers/rec/update", ctype: js, auth: "-", body: []byte(`{"seq": [0], "h": [[1,1]]}`), want: 401, invalid: true},
		{name: "update shutting down", shut: true, method: "POST", path: "/v1/buffers/rec/update", ctype: js, body: []byte(`{"seq": [0], "h": [[1,1]]}`), want: 503, code: "shutting_down"},
		{name: "rows after updates", method: "GET", path: "/v1/buffers/rec/rows", accept: js, want: 200},

		// rows
		{name: "rows JSON", method: "GET", path: "/v1/buffers/cp/rows?from_seq=0&count=10", accept: js, want: 200},
		{name: "rows safetensors", method: "GET", path: "/v1/buffers/cp/rows?from_seq=-5", want: 200},
		{name: "rows defaults", method: "GET", path: "/v1/buffers/cp/rows", accept: st, want: 200},
		{name: "rows of an empty buffer", method: "GET", path: "/v1/buffers/plain.v1/rows", accept: js, want: 200},
		{name: "rows count 0", method: "GET", path: "/v1/buffers/cp/rows?count=0", want: 400, invalid: true},
		{name: "rows count not a number", method: "GET", path: "/v1/buffers/cp/rows?count=ten", want: 400, invalid: true},
		{name: "rows unknown buffer", method: "GET", path: "/v1/buffers/nope/rows", want: 404},
		{name: "rows shutting down", shut: true, method: "GET", path: "/v1/buffers/cp/rows", want: 503, code: "shutting_down"},
		{name: "rows of a trajectory", method: "GET", path: "/v1/buffers/cp/rows?traj_id=0&count=3", accept: js, want: 200},
		{name: "rows of an unknown trajectory", method: "GET", path: "/v1/buffers/cp/rows?traj_id=999999", accept: js, want: 200},
		{name: "rows of a trajectory from a negative seq", method: "GET", path: "/v1/buffers/cp/rows?traj_id=0&from_seq=-1", want: 400},
		{name: "rows traj_id not a number", method: "GET", path: "/v1/buffers/cp/rows?traj_id=x", want: 400, invalid: true},

		// dashboard
		{name: "stats", method: "GET", path: "/v1/buffers/cp/stats", want: 200},
		{name: "stats without priorities", method: "GET", path: "/v1/buffers/plain.v1/stats?buckets=5", want: 200},
		{name: "stats buckets out of range", method: "GET", path: "/v1/buffers/cp/stats?buckets=0", want: 400, invalid: true},
		{name: "stats unknown buffer", method: "GET", path: "/v1/buffers/nope/stats", want: 404},
		{name: "stats without token", method: "GET", path: "/v1/buffers/cp/stats", auth: "-", want: 401, invalid: true},
		{name: "activity", method: "GET", path: "/v1/activity", want: 200},
		{name: "activity since", method: "GET", path: "/v1/activity?since=1", want: 200},
		{name: "activity since not a number", method: "GET", path: "/v1/activity?since=yesterday", want: 400, invalid: true},
		{name: "activity since negative", method: "GET", path: "/v1/activity?since=-4", want: 400, invalid: true},
		{name: "collectors", method: "GET", path: "/v1/collectors", want: 200},
		{name: "collectors shutting down", shut: true, method: "GET", path: "/v1/collectors", want: 503, code: "shutting_down"},

		// streams
		{name: "close stream", method: "DELETE", path: "/v1/buffers/cp/streams/open", want: 200},
		{name: "close unknown stream", method: "DELETE", path: "/v1/buffers/cp/streams/never", want: 200},
		{name: "close stream of unknown buffer", method: "DELETE", path: "/v1/buffers/nope/streams/open", want: 404},

		// rate limits (window [6, 10]: at most 2 rows an extend, 4 a sample)
		{name: "create rate-limited", method: "PUT", path: "/v1/buffers/rl", ctype: js, want: 201,
			body: []byte(strings.Replace(ctCartPole, `"capacity": 64`, `"capacity": 64, "rate_limit": {"samples_per_insert": 2, "min_size": 4, "error_buffer": 4}`, 1))},
		{name: "sample rate-limited", method: "POST", path: "/v1/buffers/rl/sample", ctype: js, body: []byte(`{"batch_size": 1}`), want: 503, code: "rate_limited"},
		{name: "extend with timeout_ms", method: "POST", path: "/v1/buffers/rl/extend?stream=a&timeout_ms=100", ctype: bin, body: ctRows(t, 2), want: 200},
		{name: "extend too large for the window", method: "POST", path: "/v1/buffers/rl/extend?stream=a&timeout_ms=100", ctype: bin, body: ctRows(t, 6), want: 400},
		{name: "extend timeout_ms not a number", method: "POST", path: "/v1/buffers/rl/extend?timeout_ms=soon", ctype: bin, body: ctRows(t, 1), want: 400, invalid: true},
		{name: "extend timeout_ms negative", method: "POST", path: "/v1/buffers/rl/extend?timeout_ms=-1", ctype: bin, body: ctRows(t, 1), want: 400, invalid: true},
		{name: "info rate-limited", method: "GET", path: "/v1/buffers/rl", want: 200},
		{name: "set rate limit", method: "PUT", path: "/v1/buffers/rl/rate_limit", ctype: js, body: []byte(`{"samples_per_insert": 1, "min_size": 2, "error_buffer": 100}`), want: 200},
		{name: "set rate limit, min_size only", method: "PUT", path: "/v1/buffers/rl/rate_limit", ctype: js, body: []byte(`{"min_size": 2}`), want: 200},
		{name: "set rate limit, window too small", method: "PUT", path: "/v1/buffers/rl/rate_limit", ctype: js, body: []byte(`{"samples_per_insert": 4, "error_buffer": 3}`), want: 400},
		{name: "set rate limit, unknown key", method: "PUT", path: "/v1/buffers/rl/rate_limit", ctype: js, body: []byte(`{"spi": 4}`), want: 400, invalid: true},
		{name: "set rate limit, unknown buffer", method: "PUT", path: "/v1/buffers/nope/rate_limit", ctype: js, body: []byte(`{"min_size": 1}`), want: 404},
		{name: "set rate limit without token", method: "PUT", path: "/v1/buffers/rl/rate_limit", ctype: js, auth: "-", body: []byte(`{"min_size": 1}`), want: 401, invalid: true},
		{name: "remove rate limit", method: "PUT", path: "/v1/buffers/rl/rate_limit", ctype: js, body: []byte(`null`), want: 200},

		// checkpoints
		{name: "checkpoint", method: "POST", path: "/v1/buffers/cp/checkpoint", ctype: js, body: []byte(`{"dir": "a/cp"}`), want: 200},
		{name: "checkpoint NDJSON", method: "POST", path: "/v1/buffers/cp/checkpoint", ctype: js, accept: "application/x-ndjson", body: []byte(`{"dir": "b"}`), want: 200},
		{name: "checkpoint exists", method: "POST", path: "/v1/buffers/cp/checkpoint", ctype: js, body: []byte(`{"dir": "a/cp"}`), want: 409, code: "exists"},
		{name: "checkpoint outside the root", method: "POST", path: "/v1/buffers/cp/checkpoint", ctype: js, body: []byte(`{"dir": "../x"}`), want: 400},
		{name: "checkpoint unknown key", method: "POST", path: "/v1/buffers/cp/checkpoint", ctype: js, body: []byte(`{"path": "x"}`), want: 400, invalid: true},
		{name: "checkpoint unknown buffer", method: "POST", path: "/v1/buffers/nope/checkpoint", ctype: js, body: []byte(`{"dir": "x"}`), want: 404},

		// collectors
		{name: "weights", method: "PUT", path: "/v1/collectors/demo/weights", ctype: bin, body: weights, want: 200},
		{name: "collector", method: "GET", path: "/v1/collectors/demo", want: 200},
		{name: "collector unknown", method: "GET", path: "/v1/collectors/other", want: 404},
		{name: "weights wrong shape", method: "PUT", path: "/v1/collectors/demo/weights", ctype: st, body: badWeights, want: 400},
		{name: "weights unknown collector", method: "PUT", path: "/v1/collectors/other/weights", ctype: bin, body: weights, want: 404},
		{name: "weights too large", method: "PUT", path: "/v1/collectors/demo/weights", ctype: bin, body: big, want: 413},

		// delete
		{name: "delete", method: "DELETE", path: "/v1/buffers/plain.v1", want: 204},
		{name: "delete again", method: "DELETE", path: "/v1/buffers/plain.v1", want: 404},
		{name: "delete bad name", method: "DELETE", path: "/v1/buffers/a..b", want: 400, invalid: true},
		{name: "delete shutting down", shut: true, method: "DELETE", path: "/v1/buffers/cp", want: 503, code: "shutting_down"},
		{name: "info with slice figures", method: "GET", path: "/v1/buffers/cp?slice_len=3", want: 200},
		{name: "info slice_len out of range", method: "GET", path: "/v1/buffers/cp?slice_len=0", want: 400, invalid: true},
		{name: "info after all", method: "GET", path: "/v1/buffers/cp", want: 200},
		{name: "list shutting down", shut: true, method: "GET", path: "/v1/buffers", want: 503, code: "shutting_down"},
	}
}

func TestContract(t *testing.T) {
	doc, router := ctLoad(t)
	live, shut := ctServers(t)

	operations := map[string]bool{} // "METHOD /path" of the spec hit by a case
	statuses := map[int]bool{}
	codes := map[string]bool{}
	for _, c := range ctCases(t) {
		t.Run(c.name, func(t *testing.T) {
			base := live.URL
			if c.shut {
				base = shut.URL
			}
			x := ctSend(t, base, c)
			statuses[x.status] = true
			if x.status != c.want {
				t.Errorf("%s %s: status %d, want %d; answer %.300s", c.method, c.path, x.status, c.want, x.answer)
			}
			if x.status >= 400 {
				code := ctErrorBody(t, x)
				if code != c.code {
					t.Errorf("error code %q, want %q", code, c.code)
				}
				codes[code] = true
			}
			route, reqErr, respErr := ctValidate(t, router, x)
			if route == nil {
				t.Fatalf("%v", reqErr)
			}
			operations[c.method+" "+route.Path] = true
			switch {
			case c.invalid && reqErr == nil:
				t.Errorf("the spec accepts this request, but it is marked as one the spec rejects")
			case c.invalid:
				first, _, _ := strings.Cut(reqErr.Error(), "\n")
				t.Logf("the spec rejects the request, as it should: %.200s", first)
			case !c.invalid && reqErr != nil:
				t.Errorf("request does not match the spec: %v", reqErr)
			}
			if respErr != nil {
				t.Errorf("answer (%d, %s) does not match the spec: %v\nanswer: %.500s", x.status, x.header.Get("Content-Type"), respErr, x.answer)
			}
		})
	}

	// Every operation of the spec was exercised, and every status and
	// error code the contract lists was seen.
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !operations[method+" "+path] {
				t.Errorf("no case exercises %s %s", method, path)
			}
		}
	}
	for _, s := range []int{200, 201, 204, 400, 401, 404, 409, 413, 415, 503} {
		if !statuses[s] {
			t.Errorf("no case answered %d", s)
		}
	}
	for _, c := range []string{"not_ready", "shutting_down", "rate_limited"} {
		if !codes[c] {
			t.Errorf("no case answered code %q", c)
		}
	}
}

// ctErrorBody checks that an error answer is JSON {"error": non-empty
// string, "code"?: string} (plus "rate_limit" when the code is
// rate_limited) and returns the code.
func ctErrorBody(t *testing.T, x ctExchange) string {
	t.Helper()
	if mt, _, _ := mime.ParseMediaType(x.header.Get("Content-Type")); mt != "application/json" {
		t.Errorf("error answer has Content-Type %q, want application/json", x.header.Get("Content-Type"))
	}
	var body map[string]any
	if err := json.Unmarshal(x.answer, &body); err != nil {
		t.Errorf("error answer is not a JSON object: %v: %.200q", err, x.answer)
		return ""
	}
	msg, ok := body["error"].(string)
	if !ok || msg == "" {
		t.Errorf(`error answer lacks a non-empty "error" string: %s`, x.answer)
	}
	for k := range body {
		// rate_limit (the limiter's state) comes only with rate_limited.
		if k != "error" && k != "code" && (k != "rate_limit" || body["code"] != "rate_limited") {
			t.Errorf("error answer has unexpected key %q: %s", k, x.answer)
		}
	}
	code, _ := body["code"].(string)
	if x.status == http.StatusServiceUnavailable && x.header.Get("Retry-After") == "" {
		t.Errorf("503 without Retry-After")
	}
	return code
}

// TestContractDocsTable checks that every endpoint in the table of
// docs/http-api.md is in the spec, and the other way round.
func TestContractDocsTable(t *testing.T) {
	doc, _ := ctLoad(t)
	md, err := os.ReadFile("../docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(GET|PUT|POST|DELETE) (/[^`?]*)[^`]*` \\|")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(md), -1) {
		documented[m[1]+" "+m[2]] = true
	}
	if len(documented) < 10 {
		t.Fatalf("found only %d endpoints in http-api.md's table; has its format changed?", len(documented))
	}
	inSpec := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			inSpec[method+" "+path] = true
		}
	}
	for ep := range documented {
		if !inSpec[ep] {
			t.Errorf("http-api.md lists %s, openapi.yaml does not", ep)
		}
	}
	for ep := range inSpec {
		if !documented[ep] {
			t.Errorf("openapi.yaml lists %s, http-api.md does not", ep)
		}
	}
}

// TestContractCatchesDrift shows that the validation is not vacuous: the
// same exchanges fail against a spec altered the way drift would alter it.
func TestContractCatchesDrift(t *testing.T) {
	live, _ := ctServers(t)
	create := ctSend(t, live.URL, ctCase{method: "PUT", path: "/v1/buffers/cp", ctype: "application/json", body: []byte(ctCartPole)})
	extend := ctSend(t, live.URL, ctCase{method: "POST", path: "/v1/buffers/cp/extend", ctype: "application/octet-stream", body: ctRows(t, 3)})
	conflict := ctSend(t, live.URL, ctCase{method: "PUT", path: "/v1/buffers/cp", ctype: "application/json",
		body: []byte(strings.Replace(ctCartPole, "64", "65", 1))})
	notReady := ctSend(t, live.URL, ctCase{method: "POST", path: "/v1/buffers/cp/sample", ctype: "application/json",
		body: []byte(`{"sampler": "slice", "num_slices": 1, "slice_len": 50}`)})
	if create.status != 201 || extend.status != 200 || conflict.status != 409 || notReady.status != 503 {
		t.Fatalf("setup: statuses %d %d %d %d", create.status, extend.status, conflict.status, notReady.status)
	}

	for _, tc := range []struct {
		name  string
		x     ctExchange
		alter func(doc *openapi3.T)
	}{
		{"Info gains a required key the server does not send", create, func(doc *openapi3.T) {
			s := doc.Components.Schemas["Info"].Value
			s.Required = append(s.Required, "colour")
		}},
		{"Info loses a key the server sends", create, func(doc *openapi3.T) {
			delete(doc.Components.Schemas["Info"].Value.Properties, "samples_served")
		}},
		{"ExtendResult.rows becomes a string", extend, func(doc *openapi3.T) {
			doc.Components.Schemas["ExtendResult"].Value.Properties["rows"].Value.Type = &openapi3.Types{"string"}
		}},
		{"409 no longer documented", conflict, func(doc *openapi3.T) {
			doc.Paths.Value("/v1/buffers/{name}").Put.Responses.Delete("409")
		}},
		{"not_ready dropped from the 503 codes", notReady, func(doc *openapi3.T) {
			doc.Components.Schemas["UnavailableError"].Value.Properties["code"].Value.Enum = []any{"shutting_down"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, _ := ctLoad(t)
			// Validate before altering: the unaltered spec must accept it.
			router, err := legacyrouter.NewRouter(doc)
			if err != nil {
				t.Fatal(err)
			}
			if _, reqErr, respErr := ctValidate(t, router, tc.x); reqErr != nil || respErr != nil {
				t.Fatalf("unaltered spec: request %v, answer %v", reqErr, respErr)
			}
			tc.alter(doc)
			router, err = legacyrouter.NewRouter(doc)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, respErr := ctValidate(t, router, tc.x); respErr == nil {
				t.Errorf("the altered spec still accepts the answer %.200s", tc.x.answer)
			}
		})
	}
}

// TestContractBodyLimitBoundsMemory: a request whose Content-Length claims
// more than --max-body must cost the server no more memory than the limit:
// bodies are read as they arrive, and the declared length reserves nothing.
func TestContractBodyLimitBoundsMemory(t *testing.T) {
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(db, &server.Options{MaxBody: ctMaxBody}).Handler())
	t.Cleanup(func() { ts.Close(); db.Close() })

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /v1/buffers/x HTTP/1.1\r\nHost: rbd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 64<<20)
	if _, err := conn.Write(bytes.Repeat([]byte(" "), 2*ctMaxBody)); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	status, _ := io.ReadAll(io.LimitReader(conn, int64(len("HTTP/1.1 413"))))
	runtime.ReadMemStats(&ms)
	allocated := ms.TotalAlloc - before
	if string(status) != "HTTP/1.1 413" {
		t.Fatalf("answer starts %q, want HTTP/1.1 413", status)
	}
	if allocated > 8*ctMaxBody {
		t.Errorf("a request refused at --max-body %d MiB allocated %d MiB on the server (the declared Content-Length must reserve nothing)",
			ctMaxBody>>20, allocated>>20)
	}
}

// TestContractSampleRequestKeys checks that the spec's SampleRequest lists
// exactly the keys of rbd.SampleRequest (the server's parser) and of the Go
// client's SampleRequest, plus the keys of sample streams (read by
// server/stream.go's parseStreamRequest, sent from client.StreamOptions).
func TestContractSampleRequestKeys(t *testing.T) {
	streamKeys := []string{"batches", "depth", "stop_at_epoch_end"}
	doc, _ := ctLoad(t)
	var inSpec []string
	for k := range doc.Components.Schemas["SampleRequest"].Value.Properties {
		inSpec = append(inSpec, k)
	}
	slices.Sort(inSpec)
	for _, typ := range []reflect.Type{reflect.TypeFor[rbd.SampleRequest](), reflect.TypeFor[client.SampleRequest]()} {
		keys := slices.Clone(streamKeys)
		for f := range typ.Fields() {
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
				keys = append(keys, name)
			}
		}
		slices.Sort(keys)
		if !slices.Equal(keys, inSpec) {
			t.Errorf("%v has keys %v; openapi.yaml's SampleRequest has %v", typ, keys, inSpec)
		}
	}
}
