// Package loadgen makes the rows the load programs (bench/soak,
// bench/limits) write and checks the rows they read back: every field of
// a row derives from one token, so a torn, misplaced or lost row is seen.
package loadgen

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	"github.com/rbdb/rbd/codec"
)

// TrajLen is the length of every trajectory a writer makes (its row i is
// done when i%TrajLen == TrajLen-1).
const TrajLen = 25

// Spec is a CartPole-shaped compact spec with the given capacity, storage
// and extra top-level keys (e.g. `, "durability": "fsync"`).
func Spec(capacity int, storage, extra string) []byte {
	return fmt.Appendf(nil, `{"capacity": %d, "storage": %q,
 "fields": {"observation": {"dtype": "float32", "shape": [4]}, "action": {"dtype": "int64", "shape": []},
            "next.reward": {"dtype": "float32", "shape": []}, "next.done": {"dtype": "bool", "shape": []}},
 "compact_obs": true %s}`, capacity, storage, extra)
}

// Token is writer w's i-th row's token.
func Token(w, i int64) int64 { return w<<24 | i }

// ObsOf is the observation of the row with token tok.
func ObsOf(tok int64) [4]float32 {
	f := float32(tok % 1_000_003)
	return [4]float32{f, f + 0.25, f + 0.5, f + 0.75}
}

func doneOf(tok int64) bool { return (tok&(1<<24-1))%TrajLen == TrajLen-1 }

// Body encodes the rows with tokens [first, first+n) as a safetensors
// extend body (final observations of done rows as [D, 4]).
func Body(first int64, n int) []byte {
	var obs, act, rew, done, final []byte
	d := 0
	for k := range n {
		tok := first + int64(k)
		for _, v := range ObsOf(tok) {
			obs = binary.LittleEndian.AppendUint32(obs, math.Float32bits(v))
		}
		act = binary.LittleEndian.AppendUint64(act, uint64(tok))
		rew = binary.LittleEndian.AppendUint32(rew, math.Float32bits(float32(tok%7)))
		if doneOf(tok) {
			done = append(done, 1)
			for _, v := range ObsOf(-tok) {
				final = binary.LittleEndian.AppendUint32(final, math.Float32bits(v))
			}
			d++
		} else {
			done = append(done, 0)
		}
	}
	ts := []codec.Tensor{
		{Name: "observation", DType: "float32", Shape: []int{n, 4}, Data: obs},
		{Name: "action", DType: "int64", Shape: []int{n}, Data: act},
		{Name: "next.reward", DType: "float32", Shape: []int{n}, Data: rew},
		{Name: "next.done", DType: "bool", Shape: []int{n}, Data: done},
	}
	if d > 0 {
		ts = append(ts, codec.Tensor{Name: "next.observation", DType: "float32", Shape: []int{d, 4}, Data: final})
	}
	hdr, _, err := codec.SafetensorsHeader(ts, nil)
	if err != nil {
		panic(err) // the tensors above are well formed
	}
	out := append([]byte(nil), hdr...)
	for _, t := range ts {
		out = append(out, t.Data...)
	}
	return out
}

// Row is one row read back: its seq and token.
type Row struct{ Seq, Token int64 }

// Check decodes a safetensors answer (sample or rows) and checks that
// every row's observation derives from its action (its token). It returns
// the rows, or an error naming the first torn one.
func Check(body []byte) ([]Row, error) {
	ts, _, err := codec.DecodeSafetensors(body)
	if err != nil {
		return nil, err
	}
	by := map[string]codec.Tensor{}
	for _, t := range ts {
		by[t.Name] = t
	}
	seq, act, obs := by["seq"], by["action"], by["observation"]
	n := len(seq.Data) / 8
	if len(act.Data) != 8*n || len(obs.Data) != 16*n {
		return nil, fmt.Errorf("answer of %d rows has %d action and %d observation bytes", n, len(act.Data), len(obs.Data))
	}
	rows := make([]Row, n)
	for j := range n {
		s := int64(binary.LittleEndian.Uint64(seq.Data[8*j:]))
		tok := int64(binary.LittleEndian.Uint64(act.Data[8*j:]))
		want := ObsOf(tok)
		for k := range 4 {
			if v := math.Float32frombits(binary.LittleEndian.Uint32(obs.Data[16*j+4*k:])); v != want[k] {
				return rows[:j], fmt.Errorf("seq %d token %d: observation[%d] = %v, want %v (a torn or misplaced row)", s, tok, k, v, want[k])
			}
		}
		rows[j] = Row{s, tok}
	}
	return rows, nil
}

// Getter fetches a path of the server and returns the status and body.
type Getter func(path string) (int, []byte, error)

// ReadWindow reads every live row of a buffer (GET .../rows, page by page)
// and returns the window's first seq and each row's token, checking every
// row as Check does.
func ReadWindow(get Getter, buffer string, capacity int64) (lo int64, tokens map[int64]int64, err error) {
	st, body, err := get("/v1/buffers/" + buffer)
	if err != nil || st != 200 {
		return 0, nil, fmt.Errorf("info %s: %d %v", buffer, st, err)
	}
	var info struct {
		WriteCount int64 `json:"write_count"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return 0, nil, err
	}
	lo = max(0, info.WriteCount-capacity)
	tokens = map[int64]int64{}
	for from := lo; ; {
		st, body, err := get(fmt.Sprintf("/v1/buffers/%s/rows?from_seq=%d&count=4096", buffer, from))
		if err != nil || st != 200 {
			return lo, tokens, fmt.Errorf("rows %s: %d %v", buffer, st, err)
		}
		rows, err := Check(body)
		if err != nil {
			return lo, tokens, err
		}
		if len(rows) == 0 {
			return lo, tokens, nil
		}
		for _, r := range rows {
			tokens[r.Seq] = r.Token
		}
		from = rows[len(rows)-1].Seq + 1
	}
}
