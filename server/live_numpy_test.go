package server_test

// A live interop test: a plain Python reader (urllib + json + numpy, no rbd
// package) samples from a real server and must see exactly what the Go
// decoder sees for the same seeded request, and what was written.
//
//	go test ./server -run TestLiveNumpySample -v
//
// It needs Debian's /usr/bin/python3 with numpy (CI installs python3-numpy);
// a pyenv python3 earlier on PATH usually lacks numpy, hence the full path.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/server"
)

const (
	lnPython  = "/usr/bin/python3"
	lnScript  = "../tests/python/live_sample.py"
	lnEpisode = 10 // rows per trajectory
	lnRows    = 100
)

// lnObs is the observation written at seq s; lnFinal the final observation
// sent for a done row at seq s.
func lnObs(s int64) []float32 {
	return []float32{float32(s), float32(s) + 0.5, -float32(s), float32(s) / 4}
}

func lnFinal(s int64) []float32 {
	return []float32{1000 + float32(s), 0.125, -0.125, float32(s) / 8}
}

// lnFill writes lnRows rows in four requests on one stream: trajectories
// of lnEpisode rows, alternately terminated and truncated, the final
// observation of each sent. Capacity 64 makes the ring wrap.
func lnFill(t *testing.T, url string) {
	t.Helper()
	c, err := client.New(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	spec := []byte(`{"capacity": 64, "storage": "memmap",
	 "fields": {"observation": {"dtype": "float32", "shape": [4]},
	            "action": {"dtype": "int64", "shape": []},
	            "next.reward": {"dtype": "float32", "shape": []},
	            "next.done": {"dtype": "bool", "shape": []},
	            "next.terminated": {"dtype": "bool", "shape": []},
	            "next.truncated": {"dtype": "bool", "shape": []}},
	 "compact_obs": true, "obs_keys": ["observation"]}`)
	if _, _, err := c.CreateBufferJSON(ctx, "cp", spec); err != nil {
		t.Fatal(err)
	}
	const per = lnRows / 4
	for first := int64(0); first < lnRows; first += per {
		var obs, final []float32
		var action []int64
		var reward []float32
		var done, term, trunc []bool
		for s := first; s < first+per; s++ {
			obs = append(obs, lnObs(s)...)
			action = append(action, s%3)
			reward = append(reward, float32(s)*0.25)
			end := s%lnEpisode == lnEpisode-1
			done = append(done, end)
			term = append(term, end && (s/lnEpisode)%2 == 0)
			trunc = append(trunc, end && (s/lnEpisode)%2 == 1)
			if end {
				final = append(final, lnFinal(s)...)
			}
		}
		ts := []codec.Tensor{
			client.NewTensor("observation", []int{per, 4}, obs),
			client.NewTensor("action", nil, action),
			client.NewTensor("next.reward", nil, reward),
			client.NewTensor("next.done", nil, done),
			client.NewTensor("next.terminated", nil, term),
			client.NewTensor("next.truncated", nil, trunc),
			client.NewTensor("next.observation", []int{len(final) / 4, 4}, final),
		}
		res, err := c.Extend(ctx, "cp", "actor", ts)
		if err != nil {
			t.Fatal(err)
		}
		if res.FirstSeq != first {
			t.Fatalf("extend: first_seq %d, want %d", res.FirstSeq, first)
		}
	}
}

// lnAnswer is what live_sample.py prints.
type lnAnswer struct {
	Request     json.RawMessage   `json:"request"`
	ContentType string            `json:"content_type"`
	Metadata    map[string]string `json:"metadata"`
	Tensors     map[string]struct {
		DType  string            `json:"dtype"`
		Shape  []int             `json:"shape"`
		Values []json.RawMessage `json:"values"`
	} `json:"tensors"`
}

// lnSTDType maps rbd dtype names to the safetensors names Python reports.
var lnSTDType = map[string]string{
	"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
	"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
}

// lnValue returns element i of t as the JSON text Python's json.dump would
// give for the same value (ints exactly, floats as float64, bools).
func lnValue(t *codec.Tensor, i int) (string, error) {
	d := t.Data
	switch t.DType {
	case "bool":
		return strconv.FormatBool(d[i] != 0), nil
	case "uint8":
		return strconv.Itoa(int(d[i])), nil
	case "int8":
		return strconv.Itoa(int(int8(d[i]))), nil
	case "int16":
		return strconv.Itoa(int(int16(binary.LittleEndian.Uint16(d[2*i:])))), nil
	case "int32":
		return strconv.Itoa(int(int32(binary.LittleEndian.Uint32(d[4*i:])))), nil
	case "int64":
		return strconv.FormatInt(int64(binary.LittleEndian.Uint64(d[8*i:])), 10), nil
	case "float32":
		return lnFloat(float64(math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:])))), nil
	case "float64":
		return lnFloat(math.Float64frombits(binary.LittleEndian.Uint64(d[8*i:]))), nil
	}
	return "", fmt.Errorf("tensor %q: dtype %s not handled by this test", t.Name, t.DType)
}

func lnFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// lnSame reports whether Python's JSON value and Go's formatted value are
// the same number (or bool, or non-finite string).
func lnSame(raw json.RawMessage, goText string) bool {
	py := strings.Trim(string(raw), `"`)
	if py == goText {
		return true
	}
	a, err1 := strconv.ParseFloat(py, 64)
	b, err2 := strconv.ParseFloat(goText, 64)
	return err1 == nil && err2 == nil && a == b
}

func lnNeedNumpy(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(lnPython); err != nil {
		t.Skipf("skipping: %s not found (install python3 and python3-numpy to run this interop test)", lnPython)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, lnPython, "-c", "import numpy").CombinedOutput(); err != nil {
		t.Skipf("skipping: %s cannot import numpy (install python3-numpy): %v: %s", lnPython, err, bytes.TrimSpace(out))
	}
}

func TestLiveNumpySample(t *testing.T) {
	lnNeedNumpy(t)
	db, err := rbd.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(db, nil).Handler())
	t.Cleanup(func() { ts.Close(); db.Close() })
	lnFill(t, ts.URL)
	url := ts.URL + "/v1/buffers/cp/sample"

	for _, tc := range []struct{ name, req string }{
		{"default", ""}, // the script's own request: {"batch_size": 32, "seed": 7}
		{"keys", `{"batch_size": 48, "seed": 0, "keys": ["observation", "next.reward", "next.done", "next.truncated"]}`},
		{"slices", `{"sampler": "slice", "num_slices": 3, "slice_len": 4, "seed": -1}`},
	} {
		req := tc.req
		t.Run(tc.name, func(t *testing.T) {
			args := []string{lnScript, url}
			if req != "" {
				args = append(args, req)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, lnPython, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s %v: %v\n%s", lnPython, args, err, stderr.Bytes())
			}
			var py lnAnswer
			if err := json.Unmarshal(out, &py); err != nil {
				t.Fatalf("script output: %v\n%.500s", err, out)
			}
			if py.ContentType != "application/octet-stream" {
				t.Errorf("Python saw Content-Type %q", py.ContentType)
			}

			// The same request, decoded in Go.
			resp, err := http.Post(url, "application/json", bytes.NewReader(py.Request))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("Go sample: %d %v %.300s", resp.StatusCode, err, body)
			}
			tensors, meta, err := codec.DecodeSafetensors(body)
			if err != nil {
				t.Fatal(err)
			}
			if len(meta) != len(py.Metadata) {
				t.Errorf("metadata: Go %v, Python %v", meta, py.Metadata)
			}
			var names []string
			for i := range tensors {
				g := &tensors[i]
				names = append(names, g.Name)
				p, ok := py.Tensors[g.Name]
				if !ok {
					t.Errorf("tensor %q: Go has it, Python does not", g.Name)
					continue
				}
				if p.DType != lnSTDType[g.DType] || !slices.Equal(p.Shape, g.Shape) {
					t.Errorf("tensor %q: Python %s %v, Go %s %v", g.Name, p.DType, p.Shape, g.DType, g.Shape)
					continue
				}
				if len(p.Values) != g.Elems() {
					t.Errorf("tensor %q: Python has %d values, Go %d", g.Name, len(p.Values), g.Elems())
					continue
				}
				for j, pv := range p.Values {
					gv, err := lnValue(g, j)
					if err != nil {
						t.Fatal(err)
					}
					if !lnSame(pv, gv) {
						t.Errorf("tensor %q element %d: Python %s, Go %s", g.Name, j, pv, gv)
						break
					}
				}
			}
			if len(py.Tensors) != len(tensors) {
				t.Errorf("Python has %d tensors, Go %d (%v)", len(py.Tensors), len(tensors), names)
			}
			lnCheckKnown(t, tensors)
		})
	}
}

// lnCheckKnown checks the sampled rows against what was written: each
// row's fields follow from its seq, and next.observation is the next row's
// observation or, at the end of a trajectory, the final observation sent.
func lnCheckKnown(t *testing.T, tensors []codec.Tensor) {
	t.Helper()
	get := func(name string) *codec.Tensor {
		for i := range tensors {
			if tensors[i].Name == name {
				return &tensors[i]
			}
		}
		return nil
	}
	seqT, stepT := get("seq"), get("step")
	if seqT == nil || stepT == nil {
		t.Fatal("answer lacks seq or step")
	}
	seqs, _ := client.Values[int64](seqT)
	steps, _ := client.Values[int64](stepT)
	f32 := func(name string) []float32 {
		if tt := get(name); tt != nil {
			v, err := client.Values[float32](tt)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		return nil
	}
	bools := func(name string) []bool {
		if tt := get(name); tt != nil {
			v, err := client.Values[bool](tt)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		return nil
	}
	obs, next, reward := f32("observation"), f32("next.observation"), f32("next.reward")
	done, trunc := bools("next.done"), bools("next.truncated")
	var mask []bool
	if get("mask") != nil {
		mask = bools("mask")
	}
	for i, s := range seqs {
		if s < 0 || (mask != nil && !mask[i]) {
			continue // padding
		}
		if s < lnRows-64 || s >= lnRows {
			t.Errorf("row %d: seq %d is not live", i, s)
			continue
		}
		if steps[i] != s%lnEpisode {
			t.Errorf("row %d (seq %d): step %d, want %d", i, s, steps[i], s%lnEpisode)
		}
		end := s%lnEpisode == lnEpisode-1
		if obs != nil && !slices.Equal(obs[4*i:4*i+4], lnObs(s)) {
			t.Errorf("row %d (seq %d): observation %v, want %v", i, s, obs[4*i:4*i+4], lnObs(s))
		}
		if next != nil {
			want := lnObs(s + 1)
			if end {
				want = lnFinal(s)
			}
			if !slices.Equal(next[4*i:4*i+4], want) {
				t.Errorf("row %d (seq %d): next.observation %v, want %v", i, s, next[4*i:4*i+4], want)
			}
		}
		if reward != nil && reward[i] != float32(s)*0.25 {
			t.Errorf("row %d (seq %d): reward %v, want %v", i, s, reward[i], float32(s)*0.25)
		}
		if done != nil && done[i] != end {
			t.Errorf("row %d (seq %d): done %v, want %v", i, s, done[i], end)
		}
		if trunc != nil && trunc[i] != (end && (s/lnEpisode)%2 == 1) {
			t.Errorf("row %d (seq %d): truncated %v", i, s, trunc[i])
		}
	}
}
