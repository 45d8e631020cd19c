package rbd

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/rbdb/rbd/storage"
)

// TestPlanKeyCoversRequest: every field of SampleRequest but Seed and
// TimeoutMS (which a plan must not depend on) changes the plan key, so a
// field added to SampleRequest without a place in planKey fails here
// rather than letting two requests of different shapes share a plan.
func TestPlanKeyCoversRequest(t *testing.T) {
	rt := reflect.TypeOf(SampleRequest{})
	for i := range rt.NumField() {
		f := rt.Field(i)
		if f.Name == "Seed" || f.Name == "TimeoutMS" {
			continue
		}
		var req SampleRequest
		v := reflect.ValueOf(&req).Elem().Field(i)
		switch f.Type.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Int, reflect.Int64:
			v.SetInt(3)
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem())) // a pointer to the zero value differs from nil
		case reflect.Slice:
			v.Set(reflect.MakeSlice(f.Type, 0, 0)) // empty differs from nil (all keys)
		default:
			t.Fatalf("SampleRequest.%s is a %s: teach this test (and planKey) about it", f.Name, f.Type)
		}
		if planKeyOf(&req, 0) == planKeyOf(&SampleRequest{}, 0) {
			t.Errorf("SampleRequest.%s does not change the plan key: add it to planKey", f.Name)
		}
	}
	if planKeyOf(&SampleRequest{}, 1) == planKeyOf(&SampleRequest{}, 0) {
		t.Error("the response limit does not change the plan key")
	}
	one := uint64(1)
	if planKeyOf(&SampleRequest{Seed: &one, TimeoutMS: 5}, 0) != planKeyOf(&SampleRequest{}, 0) {
		t.Error("seed or timeout_ms changes the plan key: every seeded request would plan anew")
	}
}

// TestCachedPlansMatchFreshOnes samples a sequence of requests of
// different shapes, each repeated and interleaved, and checks that the
// plan each sample used (the buffer's last one when the shape repeats)
// equals a plan made from scratch for that request.
func TestCachedPlansMatchFreshOnes(t *testing.T) {
	bufs := rqBuffers(t, true)
	yes, no := true, false
	beta := 0.7
	reqs := []SampleRequest{
		{BatchSize: 8},
		{BatchSize: 8, Keys: []string{"observation"}},
		{BatchSize: 8, Keys: []string{}},
		{BatchSize: 8, NextState: &no},
		{BatchSize: 8, NextState: &yes, Keys: []string{"observation", "next.observation"}},
		{BatchSize: 4},
		{Sampler: "slice", NumSlices: 2, SliceLen: 3},
		{Sampler: "slice", NumSlices: 2, SliceLen: 3, StrictLength: &no},
		{BatchSize: 8, NStep: &NStep{N: 2, Gamma: 0.9}},
		{BatchSize: 8, NStep: &NStep{N: 3, Gamma: 0.9}},
		{BatchSize: 8, Fill: "nan", IncludeIncomplete: true},
		{BatchSize: 8, Sampler: "without_replacement", Consumer: "a"},
		{BatchSize: 8, Sampler: "without_replacement", Consumer: "b", DropLast: true},
		{BatchSize: 8, ReturnProb: true},
	}
	prioReqs := []SampleRequest{
		{BatchSize: 8, Sampler: "prioritized"},
		{BatchSize: 8, Sampler: "prioritized", Beta: &beta},
	}
	for name, list := range map[string][]SampleRequest{"compact": reqs, "prio": prioReqs} {
		b := bufs[name]
		order := []int{}
		for i := range list {
			order = append(order, i, i, 0, i) // repeat, interleave with the first shape
		}
		for k, i := range order {
			req := list[i]
			seed := uint64(k)
			req.Seed = &seed
			got, err := b.plan(&req, 0) // 0: the response limit Sample uses without options
			if err != nil {
				t.Fatalf("%s request %d %+v: %v", name, i, list[i], err)
			}
			want, err := b.planSample(&req, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := samePlan(got, want); err != nil {
				t.Errorf("%s sample %d (request %d %+v): the plan used differs from a fresh one: %v", name, k, i, list[i], err)
			}
			if batch, err := b.Sample(t.Context(), &req, nil); err != nil {
				t.Errorf("%s sample %d: %v", name, k, err)
			} else {
				batch.Release()
			}
		}
	}
}

// samePlan compares two plans field by field, but for the request they
// were made from (a cached plan keeps a copy without seed) and functions
// (compared by being set or not).
func samePlan(a, b *plan) error {
	ca, cb := *a, *b
	ca.req, cb.req = nil, nil
	if (ca.params.Eligible == nil) != (cb.params.Eligible == nil) {
		return errors.New("eligibility test set on one only")
	}
	ca.params.Eligible, cb.params.Eligible = nil, nil
	if !reflect.DeepEqual(ca, cb) {
		return fmt.Errorf("cached %+v, fresh %+v", ca, cb)
	}
	if !reflect.DeepEqual(*a.req, withoutSeed(b.req)) {
		return errors.New("the plan's request differs beyond seed and timeout")
	}
	return nil
}

func withoutSeed(r *SampleRequest) SampleRequest {
	c := *r
	c.Seed, c.TimeoutMS = nil, 0
	return c
}

// TestCachedPlanKeepsItsOwnRequest: a caller that changes what its request
// points to after a sample (NStep here) must not change the plan other
// requests of the old shape reuse.
func TestCachedPlanKeepsItsOwnRequest(t *testing.T) {
	b := rqBuffers(t, true)["compact"]
	n := NStep{N: 2, Gamma: 0.9}
	first := SampleRequest{BatchSize: 8, NStep: &n}
	if _, err := b.plan(&first, 0); err != nil {
		t.Fatal(err)
	}
	n.N = 0 // invalid: a plan that followed the pointer would skip the check
	again := SampleRequest{BatchSize: 8, NStep: &NStep{N: 2, Gamma: 0.9}}
	p, err := b.plan(&again, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.nstep == nil || p.nstep.N != 2 {
		t.Fatalf("the cached plan's n-step is %+v after the first request's changed, want n 2", p.nstep)
	}
	if _, err := b.Sample(t.Context(), &first, nil); err == nil {
		t.Fatal("n_step.n 0 was accepted: the changed request reused the old plan")
	}
}

// TestPlanFlagsFromMetas checks which stored keys a plan gathers and which
// it writes from the rows' metadata: the episode flags come from the
// metadata unless nothing else would be gathered at the rows, whose copy
// is what checks them (then they are gathered too); with n-step the flags
// are still the row's (the transform sets them from the window).
func TestPlanFlagsFromMetas(t *testing.T) {
	b := rqBuffers(t, false)["plain"]
	names := func(cs []storage.Column) (out []string) {
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	flags := func(fs []flagCol) (out []string) {
		for _, f := range fs {
			out = append(out, f.col.Name)
		}
		return out
	}
	for _, c := range []struct {
		req               SampleRequest
		atRow, flagsFromM []string
	}{
		{SampleRequest{BatchSize: 4, Keys: []string{"observation", "next.done", "next.reward"}}, []string{"observation", "next.reward"}, []string{"next.done"}},
		{SampleRequest{BatchSize: 4, Keys: []string{"next.done", "next.terminated", "next.truncated", "next.reward"}}, []string{"next.reward"}, []string{"next.done", "next.terminated", "next.truncated"}},
		{SampleRequest{BatchSize: 4, Keys: []string{"next.done", "next.terminated"}}, []string{"next.done", "next.terminated"}, nil},
		{SampleRequest{BatchSize: 4, Keys: []string{"observation", "next.done"}, NStep: &NStep{N: 3, Gamma: 0.9}}, []string{"observation"}, []string{"next.done"}},
	} {
		p, err := b.planSample(&c.req, 0)
		if err != nil {
			t.Fatalf("%v: %v", c.req.Keys, err)
		}
		if got := names(p.atRow); !slices.Equal(got, c.atRow) {
			t.Errorf("%v: gathered at the rows %v, want %v", c.req.Keys, got, c.atRow)
		}
		if got := flags(p.flagCols); !slices.Equal(got, c.flagsFromM) {
			t.Errorf("%v: flags from the metadata %v, want %v", c.req.Keys, got, c.flagsFromM)
		}
	}
}
