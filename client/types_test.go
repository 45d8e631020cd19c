package client_test

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/rbdb/rbd/client"
	"github.com/rbdb/rbd/codec"
)

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		url  string
		opts *client.Options
		want string
	}{
		{"127.0.0.1:7450", nil, "base URL"},
		{"localhost:7450", nil, "scheme"},
		{"ftp://x", nil, "scheme"},
		{"http://", nil, "host"},
		{"http://h/?q=1", nil, "query"},
		{"http://h", &client.Options{Token: "a\nb"}, "token"},
		{"http://h", &client.Options{MaxResponseBytes: -1}, "max response"},
	} {
		if _, err := client.New(tc.url, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q, %+v) = %v, want an error naming %q", tc.url, tc.opts, err, tc.want)
		}
	}
	// Both problems are reported at once.
	_, err := client.New("ftp://x", &client.Options{MaxResponseBytes: -1})
	if err == nil || !strings.Contains(err.Error(), "scheme") || !strings.Contains(err.Error(), "max response") {
		t.Errorf("two problems: %v", err)
	}
}

func TestSpecJSON(t *testing.T) {
	s := client.Spec{Capacity: 5, Fields: []client.Field{
		{Name: "z", DType: "uint8", Shape: []int{2}, Compress: client.Ptr(false), FrameStack: &client.FrameStack{K: 4}},
		{Name: "a", DType: "bool"},
	}, Priority: &client.Priority{Alpha: 0}}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"capacity":5,"fields":{"z":{"dtype":"uint8","shape":[2],"compress":false,"frame_stack":{"k":4,"axis":0}},"a":{"dtype":"bool","shape":[]}},"priority":{"alpha":0,"eps":0}}`
	if string(b) != want {
		t.Fatalf("marshal:\n got %s\nwant %s", b, want)
	}
	var back client.Spec
	if err := json.Unmarshal([]byte(`{"capacity":5,"new_key":[1],"fields":{"z":{"dtype":"uint8","shape":[2],"compress":false,"frame_stack":{"k":4,"axis":0},"later":1},"a":{"dtype":"bool","shape":[]}},"priority":{"alpha":0,"eps":0}}`), &back); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(back)
	if string(again) != want {
		t.Fatalf("round trip:\n got %s\nwant %s", again, want)
	}
	if err := json.Unmarshal([]byte(`{"fields":[1]}`), &back); err == nil {
		t.Fatal("fields as an array decoded")
	}
}

func TestTensorHelpers(t *testing.T) {
	ft := client.NewTensor("f", []int{2, 2}, []float32{1, -2, float32(math.Inf(1)), 0.5})
	if ft.DType != "float32" || len(ft.Data) != 16 || !slices.Equal(ft.Shape, []int{2, 2}) {
		t.Fatalf("float32 tensor: %+v", ft)
	}
	if v, err := client.Values[float32](&ft); err != nil || !slices.Equal(v, []float32{1, -2, float32(math.Inf(1)), 0.5}) {
		t.Fatalf("values: %v %v", v, err)
	}
	if _, err := client.Values[float64](&ft); err == nil {
		t.Fatal("float32 read as float64")
	}
	bt := client.NewTensor("b", nil, []bool{true, false, true})
	if bt.DType != "bool" || string(bt.Data) != "\x01\x00\x01" || !slices.Equal(bt.Shape, []int{3}) {
		t.Fatalf("bool tensor: %+v", bt)
	}
	it := client.NewTensor("i", nil, []int16{-1, 258})
	if it.DType != "int16" || string(it.Data) != "\xff\xff\x02\x01" {
		t.Fatalf("int16 tensor: %+v", it)
	}
	enc, err := codec.EncodeSafetensors([]codec.Tensor{ft, bt, it}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tensors, _, err := codec.DecodeSafetensors(enc)
	if err != nil {
		t.Fatal(err)
	}
	batch := &client.Batch{Tensors: tensors}
	if v, err := client.Column[int16](batch, "i"); err != nil || !slices.Equal(v, []int16{-1, 258}) {
		t.Fatalf("column: %v %v", v, err)
	}
	if _, err := client.Column[int16](batch, "nope"); err == nil {
		t.Fatal("missing column")
	}
	if batch.Rows() != 2 {
		t.Fatalf("rows %d", batch.Rows())
	}
}
