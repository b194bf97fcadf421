package data

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestCharTokenizerRoundTrip(t *testing.T) {
	text := "To be, or not to be — ça dépend.\n"
	tok, err := NewCharTokenizer(text)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode(text)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tok.Decode(ids)
	if err != nil || back != text {
		t.Fatalf("round trip %q, %v", back, err)
	}
	// Ids follow code-point order: '\n' < ' ' < ',' < ... < 'é' < '—'.
	if ids[len(ids)-1] != 0 {
		t.Fatalf("newline is token %d, want 0 (smallest code point)", ids[len(ids)-1])
	}
	if _, err := tok.Encode("xyz€"); !errors.Is(err, ErrText) {
		t.Fatalf("unknown character: %v", err)
	}
	if _, err := tok.Decode([]int32{int32(tok.Vocab())}); !errors.Is(err, ErrText) {
		t.Fatalf("id out of range: %v", err)
	}
	b, err := json.Marshal(tok)
	if err != nil {
		t.Fatal(err)
	}
	var tok2 CharTokenizer
	if err := json.Unmarshal(b, &tok2); err != nil {
		t.Fatal(err)
	}
	ids2, err := tok2.Encode(text)
	if err != nil || len(ids2) != len(ids) {
		t.Fatal(err)
	}
	for i := range ids {
		if ids[i] != ids2[i] {
			t.Fatalf("stored tokenizer maps differently at %d", i)
		}
	}
	for _, bad := range []string{`{"type":"bpe","chars":"ab"}`, `{"type":"char","chars":"ba"}`, `{"type":"char","chars":""}`, `[1]`} {
		if err := json.Unmarshal([]byte(bad), &tok2); err == nil {
			t.Errorf("accepted tokenizer %s", bad)
		}
	}
}

func TestLoadTextSplitAndBlocks(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "t.txt")
	text := ""
	for i := 0; i < 100; i++ {
		text += "abcdefghij"
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadText(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tok.Vocab() != 10 || len(c.Train) != 900 || len(c.Val) != 100 {
		t.Fatalf("vocab %d, split %d/%d", c.Tok.Vocab(), len(c.Train), len(c.Val))
	}
	const batch, block = 4, 8
	x, y := make([]int32, batch*block), make([]int32, batch*block)
	if err := Blocks(c.Train, x, y, batch, block, 7, 3); err != nil {
		t.Fatal(err)
	}
	for i := range x {
		// Each target is the next character of the cycle a..j.
		if y[i] != (x[i]+1)%10 {
			t.Fatalf("target %d after %d", y[i], x[i])
		}
	}
	x2, y2 := make([]int32, batch*block), make([]int32, batch*block)
	_ = Blocks(c.Train, x2, y2, batch, block, 7, 3)
	same := true
	for i := range x {
		same = same && x[i] == x2[i]
	}
	if !same {
		t.Fatal("the same (seed, draw) gave another batch")
	}
	if err := Blocks(c.Val[:5], x, y, batch, block, 1, 1); !errors.Is(err, ErrText) {
		t.Fatalf("too short: %v", err)
	}
	if h := UnigramEntropy(c.Train, 10); math.Abs(h-math.Log(10)) > 1e-12 {
		t.Fatalf("uniform text entropy %v, want ln 10", h)
	}
	if _, err := os.Stat(DefaultTextPath()); err != nil {
		t.Fatalf("the default corpus is missing: %v", err)
	}
}

// TestBlockRowsShards: the shards of k ranks, each BlockRows of its rows,
// put together are the batch Blocks draws (for a text whose windows all
// differ, so a shifted or repeated row would show).
func TestBlockRowsShards(t *testing.T) {
	tokens := make([]int32, 5000)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	const batch, block = 12, 6
	x, y := make([]int32, batch*block), make([]int32, batch*block)
	if err := Blocks(tokens, x, y, batch, block, 11, 4); err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{1, 2, 3, 4, 6} {
		b := batch / k
		gx, gy := make([]int32, 0, batch*block), make([]int32, 0, batch*block)
		for r := range k {
			sx, sy := make([]int32, b*block), make([]int32, b*block)
			if err := BlockRows(tokens, sx, sy, batch, block, 11, 4, r*b, b); err != nil {
				t.Fatal(err)
			}
			gx, gy = append(gx, sx...), append(gy, sy...)
		}
		if !slices.Equal(gx, x) || !slices.Equal(gy, y) {
			t.Fatalf("%d shards of %d rows differ from the batch", k, b)
		}
	}
	for _, bad := range [][2]int{{-1, 2}, {11, 2}, {0, 13}} {
		if err := BlockRows(tokens, x, y, batch, block, 11, 4, bad[0], bad[1]); !errors.Is(err, ErrBatch) {
			t.Fatalf("rows [%d, %d): %v", bad[0], bad[0]+bad[1], err)
		}
	}
}
