package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"os"
	"sort"
	"time"

	"github.com/rbdb/rbd"
	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
	"github.com/rbdb/rbd/server"
)

// Example creates a buffer, writes one short episode and samples it back.
// The server runs in-process here; a real client only needs its URL.
func Example() {
	dir, err := os.MkdirTemp("", "rbd-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := rbd.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ts := httptest.NewServer(server.New(db, nil).Handler())
	defer ts.Close()

	ctx := context.Background()
	c, err := client.New(ts.URL, nil) // e.g. "http://127.0.0.1:7450"
	if err != nil {
		log.Fatal(err)
	}

	// A compact buffer: the writer sends observation, and next.observation
	// only for the last step of an episode; rbd rebuilds the rest.
	spec := &client.Spec{
		Capacity: 1000,
		Fields: []client.Field{
			{Name: "observation", DType: "float32", Shape: []int{2}},
			{Name: "action", DType: "int64"},
			{Name: "next.reward", DType: "float32"},
			{Name: "next.done", DType: "bool"},
		},
		CompactObs: true,
	}
	info, created, err := c.CreateBuffer(ctx, "cartpole", spec)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("created:", created, "capacity:", info.Spec.Capacity, "storage:", info.Spec.Storage)

	// Three steps of one episode, the last one done.
	res, err := c.Extend(ctx, "cartpole", "actor-0", []codec.Tensor{
		client.NewTensor("observation", []int{3, 2}, []float32{0, 0, 1, 1, 2, 2}),
		client.NewTensor("action", nil, []int64{1, 0, 1}),
		client.NewTensor("next.reward", nil, []float32{1, 1, 0}),
		client.NewTensor("next.done", nil, []bool{false, false, true}),
		client.NewTensor("next.observation", []int{1, 2}, []float32{3, 3}), // final observation
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("extend: first_seq=%d rows=%d write_count=%d\n", res.FirstSeq, res.Rows, res.WriteCount)

	// One epoch without replacement covers every row exactly once.
	batch, err := c.Sample(ctx, "cartpole", &client.SampleRequest{BatchSize: 3, Sampler: "without_replacement"})
	if err != nil {
		log.Fatal(err)
	}
	seq, _ := client.Column[int64](batch, "seq")
	obs, _ := client.Column[float32](batch, "observation")
	next, _ := client.Column[float32](batch, "next.observation")
	act, _ := client.Column[int64](batch, "action")
	order := []int{0, 1, 2}
	sort.Slice(order, func(i, j int) bool { return seq[order[i]] < seq[order[j]] })
	for _, i := range order {
		fmt.Printf("seq %d: observation %v action %d -> next.observation %v\n", seq[i], obs[2*i:2*i+2], act[i], next[2*i:2*i+2])
	}
	// Output:
	// created: true capacity: 1000 storage: memmap
	// extend: first_seq=0 rows=3 write_count=3
	// seq 0: observation [0 0] action 1 -> next.observation [1 1]
	// seq 1: observation [1 1] action 0 -> next.observation [2 2]
	// seq 2: observation [2 2] action 1 -> next.observation [3 3]
}

// ExampleRetryAfter retries a sample until the buffer has data, waiting as
// long as the server asks.
func ExampleRetryAfter() {
	sample := func(ctx context.Context, c *client.Client) (*client.Batch, error) {
		for {
			batch, err := c.Sample(ctx, "cartpole", &client.SampleRequest{BatchSize: 256})
			wait, retry := client.RetryAfter(err)
			if !retry {
				return batch, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(wait):
			}
		}
	}
	_ = sample
}
