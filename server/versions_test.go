package server

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/rbdb/rbd/codec"
)

// versionedRows is rowsJSON with every row at policy version v, observations
// starting at from (so rows of different extends differ).
func versionedRows(n, from int, v int64) string {
	var obs, act, rew, fls, ver []string
	for i := range n {
		obs = append(obs, fmt.Sprintf("[%d,0,0,0]", from+i))
		act, rew, fls = append(act, "1"), append(rew, "1"), append(fls, "false")
		ver = append(ver, fmt.Sprint(v))
	}
	j := func(v []string) string { return "[" + strings.Join(v, ",") + "]" }
	return fmt.Sprintf(`{"observation": %s, "action": %s, "next.reward": %s, "next.done": %s, "next.terminated": %s, "next.truncated": %s, "policy_version": %s}`,
		j(obs), j(act), j(rew), j(fls), j(fls), j(fls), j(ver))
}

// TestHTTPPolicyVersions: writers stamp rows with policy versions (JSON and
// safetensors), info counts them, samplers filter on min_policy_version,
// and the metrics report versions and the age of sampled rows.
func TestHTTPPolicyVersions(t *testing.T) {
	ts, _ := newTestServer(t, nil)
	url := ts.URL + "/v1/buffers/pv"
	if code, body := do(t, "PUT", url, "application/json", cartpoleSpec); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := do(t, "POST", url+"/extend?stream=a", "application/json", versionedRows(10, 0, 1)); code != 200 {
		t.Fatalf("extend v1: %d %s", code, body)
	}
	// Version 3 as safetensors, int32.
	f32 := make([]byte, 0, 16*10)
	i32 := make([]byte, 0, 4*10)
	for range 10 {
		for range 4 {
			f32 = binary.LittleEndian.AppendUint32(f32, 0)
		}
		i32 = binary.LittleEndian.AppendUint32(i32, 3)
	}
	st, err := codec.EncodeSafetensors([]codec.Tensor{
		{Name: "observation", DType: "float32", Shape: []int{10, 4}, Data: f32},
		{Name: "action", DType: "int64", Shape: []int{10}, Data: make([]byte, 80)},
		{Name: "next.reward", DType: "float32", Shape: []int{10}, Data: make([]byte, 40)},
		{Name: "next.done", DType: "bool", Shape: []int{10}, Data: make([]byte, 10)},
		{Name: "next.terminated", DType: "bool", Shape: []int{10}, Data: make([]byte, 10)},
		{Name: "next.truncated", DType: "bool", Shape: []int{10}, Data: make([]byte, 10)},
		{Name: "policy_version", DType: "int32", Shape: []int{10}, Data: i32},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := do(t, "POST", url+"/extend?stream=a", "application/octet-stream", string(st)); code != 200 {
		t.Fatalf("extend v3: %d %s", code, body)
	}
	code, body := do(t, "GET", url, "", "")
	var info struct {
		PolicyVersions struct {
			Newest, Min, Max int64
			Rows             []struct{ Version, Rows int64 }
		} `json:"policy_versions"`
	}
	if err := json.Unmarshal(body, &info); code != 200 || err != nil {
		t.Fatalf("info: %d %s %v", code, body, err)
	}
	pv := info.PolicyVersions
	if pv.Newest != 3 || pv.Min != 1 || pv.Max != 3 || len(pv.Rows) != 2 || pv.Rows[0].Version != 3 || pv.Rows[0].Rows != 10 || pv.Rows[1].Rows != 10 {
		t.Fatalf("policy versions %+v", pv)
	}

	sample := func(req string) (int, []byte) {
		return do(t, "POST", url+"/sample", "application/json", req, "Accept", "application/json")
	}
	// Only version-3 rows come back, from every transition sampler.
	for _, kind := range []string{"uniform", "prioritized", "without_replacement"} {
		// 9 of the 10 version-3 rows have a known next observation.
		code, body := sample(fmt.Sprintf(`{"batch_size": 9, "sampler": %q, "min_policy_version": 2, "seed": 1}`, kind))
		var ans struct{ Seq []int64 }
		if err := json.Unmarshal(body, &ans); code != 200 || err != nil {
			t.Fatalf("%s: %d %s", kind, code, body)
		}
		for _, s := range ans.Seq {
			if s < 10 {
				t.Fatalf("%s: seq %d of version 1 returned with min_policy_version 2", kind, s)
			}
		}
	}
	for _, c := range []struct {
		req, code, want string
	}{
		{`{"batch_size": 4, "min_policy_version": 4}`, "503", "(the newest written is 3)"},
		{`{"batch_size": 4, "min_policy_version": -1}`, "400", "min_policy_version"},
		{`{"batch_size": 4, "min_policy_version": 1.5}`, "400", "min_policy_version"},
		{`{"num_slices": 2, "slice_len": 2, "sampler": "slice", "min_policy_version": 4}`, "503", "(the newest written is 3)"},
	} {
		code, body := sample(c.req)
		if fmt.Sprint(code) != c.code || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %s, want %s naming %q", c.req, code, body, c.code, c.want)
		}
	}
	// A bad version fails the extend whole.
	bad := strings.Replace(versionedRows(2, 100, 1), `"policy_version": [1,1]`, `"policy_version": [1,-1]`, 1)
	if code, body := do(t, "POST", url+"/extend?stream=a", "application/json", bad); code != 400 || !strings.Contains(string(body), "policy_version") {
		t.Fatalf("negative version: %d %s", code, body)
	}
	code, body = do(t, "GET", ts.URL+"/metrics", "", "")
	for _, want := range []string{`rbd_buffer_policy_version_newest{buffer="pv"} 3`, `rbd_buffer_policy_version{bound="min",buffer="pv"} 1`,
		`rbd_sample_policy_age_count{buffer="pv"} 3`, `rbd_sample_policy_age_sum{buffer="pv"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(string(body), "policy"))
		}
	}
	// Without a filter, version-1 rows are two versions old.
	if code, body := sample(`{"batch_size": 19, "sampler": "without_replacement", "consumer": "all"}`); code != 200 {
		t.Fatalf("sample all: %d %s", code, body)
	}
	_, body = do(t, "GET", ts.URL+"/metrics", "", "")
	// 10 rows two versions old and 9 of age 0: a mean of 20/19.
	if !strings.Contains(string(body), `rbd_sample_policy_age_count{buffer="pv"} 4`) || !strings.Contains(string(body), `rbd_sample_policy_age_sum{buffer="pv"} 1.0526`) {
		t.Errorf("age histogram after a sample of every row:\n%s", grepLines(string(body), "policy_age"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
