package benchdata

import "github.com/rbdb/rbd/client"

// CartPoleSpec is a compact CartPole-like spec with priorities: float32[4]
// observations, an int64 action, a float32 reward and the three done flags,
// in a memmap buffer of capacity rows. The client's tests and the shards
// tests write it.
func CartPoleSpec(capacity int64) *client.Spec {
	return &client.Spec{
		Capacity: capacity,
		Storage:  "memmap",
		Fields: []client.Field{
			{Name: "observation", DType: "float32", Shape: []int{4}},
			{Name: "action", DType: "int64"},
			{Name: "next.reward", DType: "float32"},
			{Name: "next.done", DType: "bool"},
			{Name: "next.terminated", DType: "bool"},
			{Name: "next.truncated", DType: "bool"},
		},
		CompactObs: true,
		ObsKeys:    []string{"observation"},
		Priority:   client.DefaultPriority(),
	}
}
