package main

import (
	"encoding/json"
	"testing"
)

// The script helpers check the server; these check the helpers, so that a
// script cannot pass because a check is vacuous.

func TestLoadRowPattern(t *testing.T) {
	tok := int64(3)<<32 | int64(17)<<12
	var body struct {
		Observation [][4]int64 `json:"observation"`
		Done        []bool     `json:"next.done"`
		Env         []int64    `json:"env"`
	}
	if err := json.Unmarshal(loadBody(tok, 512), &body); err != nil {
		t.Fatal(err)
	}
	if len(body.Observation) != 512 || len(body.Done) != 512 || len(body.Env) != 512 {
		t.Fatalf("%d observations, %d dones, %d envs; want 512 each", len(body.Observation), len(body.Done), len(body.Env))
	}
	seen := map[int64]bool{}
	for i, obs := range body.Observation {
		if !loadRowOK(obs, body.Done[i]) {
			t.Fatalf("row %d: %v done %v: whole row rejected", i, obs, body.Done[i])
		}
		if seen[obs[0]] {
			t.Fatalf("row %d: value %d repeats an earlier row's", i, obs[0])
		}
		seen[obs[0]] = true
		for k := range obs {
			torn := obs
			torn[k] ^= 1 << 20
			if loadRowOK(torn, body.Done[i]) {
				t.Fatalf("row %d: %v with element %d changed accepted", i, torn, k)
			}
		}
		if loadRowOK(obs, !body.Done[i]) {
			t.Fatalf("row %d: flipped done accepted", i)
		}
		// A row of another extend (or writer) mixed in is torn.
		other := body.Observation[(i+1)%len(body.Observation)]
		mixed := [4]int64{obs[0], obs[1], other[2], other[3]}
		if loadRowOK(mixed, body.Done[i]) {
			t.Fatalf("row %d: %v mixed from two rows accepted", i, mixed)
		}
	}
}

func TestJSONAt(t *testing.T) {
	doc := []byte(`{"a": {"next.obs": [[1, 2], [3, 4.5]], "s": "x"}, "n": -1, "e": []}`)
	for _, c := range []struct {
		path, op, want string
		ok             bool
	}{
		{"a/next.obs/@len", "==", "2", true},
		{"a/next.obs/1/1", "==", "4.5", true},
		{"a/next.obs/-1/0", "==", "3", true},
		{"a/next.obs/0/1", ">", "1", true},
		{"a/next.obs/0/1", "<", "2", false},
		{"a/s", "==", "x", true},
		{"a/s", "!=", "x", false},
		{"a/@len", "==", "2", true},
		{"n", "<=", "-1", true},
		{"e/@len", "==", "0", true},
	} {
		v, err := jsonAt(doc, c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		ok, err := compare(v, c.op, c.want)
		if err != nil || ok != c.ok {
			t.Errorf("%s (%s) %s %s = %v, %v; want %v", c.path, render(v), c.op, c.want, ok, err, c.ok)
		}
	}
	for _, path := range []string{"b", "a/next.obs/2", "a/s/0", "a/next.obs/x", "e/0"} {
		if v, err := jsonAt(doc, path); err == nil {
			t.Errorf("%s = %s, want an error", path, render(v))
		}
	}
	if _, err := compare("x", "<", "1"); err == nil {
		t.Error("ordering a string: no error")
	}
}
