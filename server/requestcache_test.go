package server

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/rbdb/rbd"
)

func TestRequestCacheParsesLikeTheParser(t *testing.T) {
	var c requestCache
	for _, body := range []string{
		`{"batch_size": 256}`,
		`{"batch_size": 256, "seed": 7, "keys": ["observation", "action"], "next_state": true}`,
		`{"sampler": "slice", "num_slices": 4, "slice_len": 8, "strict_length": false}`,
		`{"batch_size": 32, "n_step": {"n": 3, "gamma": 0.9}, "beta": 0.5}`,
	} {
		want, err := rbd.ParseSampleRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 { // a miss, then hits
			got := new(rbd.SampleRequest)
			err := c.parse([]byte(body), got)
			if err != nil {
				t.Fatalf("%s, round %d: %v", body, round, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s, round %d: got %+v, want %+v", body, round, got, want)
			}
			// Each caller gets its own request: changing one changes no
			// later answer.
			got.BatchSize, got.Sampler, got.Seed = -1, "changed", nil
		}
	}
	if len(c.m) != 4 {
		t.Fatalf("%d bodies remembered, want 4", len(c.m))
	}
}

func TestRequestCacheRemembersOnlyWhatParsed(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		wantErr    string // "" for a body that parses
		remembered bool
	}{
		{"unknown key", `{"batch_sise": 256}`, "batch_sise", false},
		{"not an object", `[1]`, "body", false},
		{"bad value", `{"batch_size": "many"}`, "batch_size", false},
		{"long body", `{"batch_size": 2, "consumer": "` + strings.Repeat("x", requestCacheMaxBody) + `"}`, "", false},
		{"small body", `{"batch_size": 2}`, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c requestCache
			for range 2 { // an error is found again, not remembered
				err := c.parse([]byte(tc.body), new(rbd.SampleRequest))
				if tc.wantErr == "" && err != nil {
					t.Fatal(err)
				}
				if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
			}
			if _, ok := c.m[tc.body]; ok != tc.remembered {
				t.Fatalf("remembered = %v, want %v", ok, tc.remembered)
			}
		})
	}
}

func TestRequestCacheIsBounded(t *testing.T) {
	var c requestCache
	for i := range 3 * requestCacheEntries {
		body := fmt.Sprintf(`{"batch_size": 8, "seed": %d}`, i) // a seed per request
		req := new(rbd.SampleRequest)
		err := c.parse([]byte(body), req)
		if err != nil || *req.Seed != uint64(i) {
			t.Fatalf("body %d: %v, %+v", i, err, req)
		}
		if len(c.m) > requestCacheEntries {
			t.Fatalf("%d bodies remembered, more than %d", len(c.m), requestCacheEntries)
		}
	}
}
