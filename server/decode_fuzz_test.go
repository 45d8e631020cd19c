package server

import (
	"encoding/binary"
	"errors"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/storage"
)

// fzCartPoleSpec is CartPole in a small memory buffer, compact, so both the
// full-length and the one-per-done-row forms of next.observation apply.
const fzCartPoleSpec = `{"capacity": 64, "storage": "memory",
 "fields": {"observation": {"dtype": "float32", "shape": [4]},
            "action": {"dtype": "int64", "shape": []},
            "next.reward": {"dtype": "float32", "shape": []},
            "next.done": {"dtype": "bool", "shape": []},
            "next.terminated": {"dtype": "bool", "shape": []},
            "next.truncated": {"dtype": "bool", "shape": []}},
 "compact_obs": true, "obs_keys": ["observation"]}`

func fzBuffer(f *testing.F) *rbd.Buffer {
	f.Helper()
	db, err := rbd.Open(f.TempDir(), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	spec, err := storage.ParseSpec([]byte(fzCartPoleSpec))
	if err != nil {
		f.Fatal(err)
	}
	b, _, err := db.CreateBuffer("cp", spec)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// fzSafetensorsBody is three CartPole rows as safetensors; final observations
// one per done row (D form) when tail, env when env.
func fzSafetensorsBody(f *testing.F, tail, env bool) []byte {
	f.Helper()
	f32 := func(vs ...float32) []byte {
		var b []byte
		for _, v := range vs {
			b = le32(b, math.Float32bits(v))
		}
		return b
	}
	ts := []codec.Tensor{
		{Name: "observation", DType: "float32", Shape: []int{3, 4}, Data: f32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2)},
		{Name: "action", DType: "int64", Shape: []int{3}, Data: make([]byte, 24)},
		{Name: "next.reward", DType: "float32", Shape: []int{3}, Data: f32(1, 1, 1)},
		{Name: "next.done", DType: "bool", Shape: []int{3}, Data: []byte{0, 0, 1}},
		{Name: "next.terminated", DType: "bool", Shape: []int{3}, Data: []byte{0, 0, 1}},
		{Name: "next.truncated", DType: "bool", Shape: []int{3}, Data: []byte{0, 0, 0}},
	}
	if tail {
		ts = append(ts, codec.Tensor{Name: "next.observation", DType: "float32", Shape: []int{1, 4}, Data: f32(3, 3, 3, 3)})
	}
	if env {
		ts = append(ts, codec.Tensor{Name: "env", DType: "int32", Shape: []int{3}, Data: []byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}})
	}
	b, err := codec.EncodeSafetensors(ts, map[string]string{"k": "v"})
	if err != nil {
		f.Fatal(err)
	}
	return b
}

func le32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }

var fzJSONBodies = []string{
	`{"observation": [[0,0,0,0],[1,1,1,1],[2,2,2,2]], "action": [0,1,0], "next.reward": [1,1,1],
	  "next.done": [false,false,true], "next.terminated": [false,false,true], "next.truncated": [false,false,false],
	  "next.observation": [[3,3,3,3]]}`,
	`{"observation": [[0,0,0,0],[1,1,1,1]], "action": [0,1], "next.reward": ["NaN","Infinity"],
	  "next.done": [0,1], "next.terminated": [0,0], "next.truncated": [0,1],
	  "next.observation": [[9,9,9,9],[3,3,3,3]], "env": [5,5]}`,
	`{"observation": [[0,0,0,0]], "action": [0], "next.reward": [1], "next.done": [false], "next.terminated": [false], "next.truncated": [false]}`,
	`{"observation": [], "action": [], "next.reward": [], "next.done": [], "next.terminated": [], "next.truncated": []}`,
	`{"observation": [[0,0,0]], "action": [0], "next.reward": [1], "next.done": [true], "next.terminated": [false], "next.truncated": [false]}`,
	`{"next.done": [true], "colour": [1]}`, `{"next.done": [true, false], "action": [1]}`,
	`{"env": [1, 2], "next.done": [true]}`, `{"env": 3}`, `null`, `[]`, `{`, ``,
}

// go test ./server -run '^$' -fuzz FuzzExtendBody -fuzztime 60s
//
// FuzzExtendBody feeds the same bytes to both extend body decoders (JSON
// and safetensors) of a CartPole buffer, and extends the buffer with
// whatever they accept, as the handler does. Nothing may panic, every
// rejection must be a 400 and an accepted batch must extend by its rows.
func FuzzExtendBody(f *testing.F) {
	b := fzBuffer(f)
	for _, s := range fzJSONBodies {
		f.Add([]byte(s))
	}
	for _, tail := range []bool{false, true} {
		for _, env := range []bool{false, true} {
			f.Add(fzSafetensorsBody(f, tail, env))
		}
	}
	if files, err := filepath.Glob(filepath.Join("..", "codec", "testdata", "*.safetensors")); err == nil {
		for _, p := range files {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, dec := range []struct {
			name string
			fn   func(*rbd.Buffer, []byte) (*storage.Batch, error)
		}{{"json", jsonBatch}, {"safetensors", safetensorsBatch}} {
			batch, err := dec.fn(b, body)
			if err != nil {
				fzWant400(t, dec.name+" decoder", body, err)
				continue
			}
			before, err := b.Info()
			if err != nil {
				t.Fatal(err)
			}
			res, err := b.Extend("", batch)
			if err != nil {
				fzWant400(t, dec.name+" extend", body, err)
				continue
			}
			if res.Rows != batch.Rows || res.FirstSeq != before.WriteCount || res.WriteCount != before.WriteCount+int64(batch.Rows) {
				t.Fatalf("%s body %q: extend answered %+v for %d rows after write_count %d", dec.name, body, res, batch.Rows, before.WriteCount)
			}
		}
	})
}

func fzWant400(t *testing.T, what string, body []byte, err error) {
	t.Helper()
	status, _ := statusOf(err)
	if status != http.StatusBadRequest {
		t.Fatalf("%s: %q -> %v: status %d, want 400", what, body, err, status)
	}
	if msg := err.Error(); msg == "" || strings.Contains(msg, "%!") {
		t.Fatalf("%s: %q -> badly formatted error %q", what, body, msg)
	}
	if errors.Is(err, storage.ErrClosed) {
		t.Fatalf("%s: buffer closed: %v", what, err)
	}
}

// go test ./server -run '^$' -fuzz FuzzExtendRows -fuzztime 60s
//
// FuzzExtendRows builds CartPole rows from fuzzed values and flags, encodes
// them both as safetensors and as JSON, and checks that the two decoders
// agree: both reject, or both produce the same batch (NaN payloads aside,
// which JSON cannot carry), which the buffer then takes or refuses alike.
func FuzzExtendRows(f *testing.F) {
	b := fzBuffer(f)
	f.Add(uint8(3), []byte{0, 0, 3}, []byte("0123456789abcdef"), uint8(2), false)
	f.Add(uint8(2), []byte{0, 5}, []byte{0xff, 0xff, 0xc0, 0x7f, 1}, uint8(1), true)
	f.Add(uint8(4), []byte{1, 2, 4, 3}, []byte{}, uint8(3), true)
	f.Add(uint8(0), []byte{}, []byte{}, uint8(0), false)
	f.Fuzz(func(t *testing.T, n uint8, flags, vals []byte, tailForm uint8, withEnv bool) {
		rows := int(n % 8)
		flag := func(r, bit int) byte {
			if r < len(flags) {
				return flags[r] >> bit & 1
			}
			return 0
		}
		next := 0
		word := func() uint64 { // 8 bytes of vals, cycling; zeros when empty
			var w uint64
			for i := range 8 {
				if len(vals) > 0 {
					w |= uint64(vals[next%len(vals)]) << (8 * i)
					next++
				}
			}
			return w
		}
		var obs, act, rew, done, term, trunc, env []byte
		nDone := 0
		for r := range rows {
			for range 2 {
				obs = binary64(obs, word()) // two float32s per word
			}
			act = binary64(act, word())
			rew = le32(rew, uint32(word()))
			// done = terminated || truncated unless bit 3 asks for a mismatch.
			t, tr := flag(r, 0), flag(r, 1)
			d := t | tr
			if flag(r, 3) == 1 {
				d ^= 1
			}
			done, term, trunc = append(done, d), append(term, t), append(trunc, tr)
			nDone += int(d)
			env = le32(env, uint32(flag(r, 2)))
		}
		ts := []codec.Tensor{
			{Name: "observation", DType: "float32", Shape: []int{rows, 4}, Data: obs},
			{Name: "action", DType: "int64", Shape: []int{rows}, Data: act},
			{Name: "next.reward", DType: "float32", Shape: []int{rows}, Data: rew},
			{Name: "next.done", DType: "bool", Shape: []int{rows}, Data: done},
			{Name: "next.terminated", DType: "bool", Shape: []int{rows}, Data: term},
			{Name: "next.truncated", DType: "bool", Shape: []int{rows}, Data: trunc},
		}
		if tailRows := []int{-1, rows, nDone, nDone + 1}[tailForm%4]; tailRows >= 0 {
			var tail []byte
			for range tailRows * 2 {
				tail = binary64(tail, word())
			}
			ts = append(ts, codec.Tensor{Name: "next.observation", DType: "float32", Shape: []int{tailRows, 4}, Data: tail})
		}
		if withEnv {
			ts = append(ts, codec.Tensor{Name: "env", DType: "int32", Shape: []int{rows}, Data: env})
		}
		stBody, err := codec.EncodeSafetensors(ts, nil)
		if err != nil {
			t.Fatal(err)
		}
		jsonBody := []byte("{")
		for i, tt := range ts {
			if i > 0 {
				jsonBody = append(jsonBody, ',')
			}
			jsonBody = append(jsonBody, '"')
			jsonBody = append(jsonBody, tt.Name...)
			jsonBody = append(jsonBody, `":`...)
			if jsonBody, err = codec.AppendJSONTensor(jsonBody, &tt); err != nil {
				t.Fatal(err)
			}
		}
		jsonBody = append(jsonBody, '}')

		sb, serr := safetensorsBatch(b, stBody)
		jb, jerr := jsonBatch(b, jsonBody)
		if (serr == nil) != (jerr == nil) {
			t.Fatalf("decoders disagree: safetensors %v, JSON %v\nJSON body %s", serr, jerr, jsonBody)
		}
		if serr != nil {
			fzWant400(t, "safetensors decoder", stBody, serr)
			fzWant400(t, "json decoder", jsonBody, jerr)
			return
		}
		if sb.Rows != jb.Rows || len(sb.Fields) != len(jb.Fields) || !slices.Equal(sb.Env, jb.Env) {
			t.Fatalf("batches differ: safetensors %d rows %d fields env %v, JSON %d rows %d fields env %v",
				sb.Rows, len(sb.Fields), sb.Env, jb.Rows, len(jb.Fields), jb.Env)
		}
		for name, sv := range sb.Fields {
			jv, ok := jb.Fields[name]
			c, _ := b.Column(name)
			same := string(sv) == string(jv)
			if c.DType == storage.Float32 {
				same = fzSameFloat32s(sv, jv)
			}
			if !ok || !same {
				t.Fatalf("field %q: safetensors %x, JSON %x (JSON body %s)", name, sv, jv, jsonBody)
			}
		}
		_, serr = b.Extend("s", sb)
		_, jerr = b.Extend("j", jb)
		if (serr == nil) != (jerr == nil) {
			t.Fatalf("extend disagrees: safetensors %v, JSON %v", serr, jerr)
		}
		if serr != nil {
			fzWant400(t, "extend", stBody, serr)
		}
	})
}

func binary64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

// fzSameFloat32s compares float32 columns bit for bit, except that a NaN
// equals any NaN.
func fzSameFloat32s(a, b []byte) bool {
	if len(a) != len(b) || len(a)%4 != 0 {
		return false
	}
	for i := 0; i < len(a); i += 4 {
		x := math.Float32frombits(binary.LittleEndian.Uint32(a[i:]))
		y := math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
		if math.Float32bits(x) != math.Float32bits(y) && !(math.IsNaN(float64(x)) && math.IsNaN(float64(y))) {
			return false
		}
	}
	return true
}

// FuzzParseStreamRequest: any body is a stream request with its keys in
// range, or an error naming a field; never a panic.
func FuzzParseStreamRequest(f *testing.F) {
	for _, seed := range []string{
		`{"batch_size": 8, "batches": 3, "depth": 2, "stop_at_epoch_end": true, "seed": 1}`,
		`{"batch_size": 8, "batches": null}`,
		`{"depth": 0}`, `{"depth": 65}`, `{"batches": -1}`, `{"batches": 1e30}`,
		`{"stop_at_epoch_end": "yes"}`, `[]`, `null`, `{"samplr": 1, "depth": 2}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sr, err := parseStreamRequest(body)
		if err != nil {
			var re *rbd.RequestError
			if !errors.As(err, &re) || re.Field == "" {
				t.Fatalf("error %v does not name a field", err)
			}
			return
		}
		if sr.depth < 1 || sr.depth > maxStreamDepth || sr.batches < 0 || sr.sample == nil {
			t.Fatalf("accepted a stream request out of range: %+v", sr)
		}
	})
}
