package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
)

// Text corpora for language models: a character tokenizer (nanoGPT's
// shakespeare_char/prepare.py: the vocabulary is the sorted set of the
// text's characters, a token is a character's index in it), the
// 90%/10% train/validation split by position, and random blocks.

// ErrText reports unusable text or tokens.
var ErrText = errors.New("data: unusable text")

// CharTokenizer maps the characters (Unicode code points) of a corpus to
// token ids 0..Vocab()-1 in code-point order.
type CharTokenizer struct {
	chars []rune
	index map[rune]int32
}

// NewCharTokenizer builds the vocabulary of text (valid UTF-8, at least one
// character).
func NewCharTokenizer(text string) (*CharTokenizer, error) {
	if !utf8.ValidString(text) {
		return nil, fmt.Errorf("%w: not valid UTF-8", ErrText)
	}
	seen := map[rune]bool{}
	for _, r := range text {
		seen[r] = true
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrText)
	}
	chars := make([]rune, 0, len(seen))
	for r := range seen {
		chars = append(chars, r)
	}
	slices.Sort(chars)
	return tokenizerOf(chars), nil
}

func tokenizerOf(chars []rune) *CharTokenizer {
	t := &CharTokenizer{chars: chars, index: make(map[rune]int32, len(chars))}
	for i, r := range chars {
		t.index[r] = int32(i)
	}
	return t
}

// Vocab is the number of tokens.
func (t *CharTokenizer) Vocab() int { return len(t.chars) }

// Encode maps text to token ids; a character outside the vocabulary is an
// error naming it.
func (t *CharTokenizer) Encode(text string) ([]int32, error) {
	out := make([]int32, 0, len(text))
	for i, r := range text {
		id, ok := t.index[r]
		if !ok {
			return nil, fmt.Errorf("%w: character %q at byte %d is not in the vocabulary", ErrText, r, i)
		}
		out = append(out, id)
	}
	return out, nil
}

// Decode maps token ids back to text; an id outside the vocabulary is an
// error.
func (t *CharTokenizer) Decode(ids []int32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		if id < 0 || int(id) >= len(t.chars) {
			return "", fmt.Errorf("%w: token %d outside a vocabulary of %d", ErrText, id, len(t.chars))
		}
		b.WriteRune(t.chars[id])
	}
	return b.String(), nil
}

// MarshalJSON stores the vocabulary as one string of its characters in
// token order (what a checkpoint's metadata carries).
func (t *CharTokenizer) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"type": "char", "chars": string(t.chars)})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (t *CharTokenizer) UnmarshalJSON(b []byte) error {
	var v map[string]string
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("%w: tokenizer: %v", ErrText, err)
	}
	if v["type"] != "char" {
		return fmt.Errorf("%w: tokenizer type %q (want char)", ErrText, v["type"])
	}
	chars := []rune(v["chars"])
	if len(chars) == 0 || !slices.IsSorted(chars) {
		return fmt.Errorf("%w: tokenizer vocabulary empty or out of order", ErrText)
	}
	for i := 1; i < len(chars); i++ {
		if chars[i] == chars[i-1] {
			return fmt.Errorf("%w: tokenizer repeats %q", ErrText, chars[i])
		}
	}
	*t = *tokenizerOf(chars)
	return nil
}

// Corpus is a tokenized text split into training and validation tokens.
type Corpus struct {
	Tok        *CharTokenizer
	Train, Val []int32
}

// DefaultTextPath is the corpus every machine with Go has: Newton's
// Opticks, in the Go distribution's testdata: under $GOROOT when set, else
// under `go env GOROOT` when a go command is on the PATH, else under
// /usr/local/go.
func DefaultTextPath() string {
	rel := filepath.Join("src", "testdata", "Isaac.Newton-Opticks.txt")
	root := os.Getenv("GOROOT")
	if root == "" {
		if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
			root = strings.TrimSpace(string(out))
		}
	}
	if root == "" {
		root = "/usr/local/go"
	}
	return filepath.Join(root, rel)
}

// LoadText reads a UTF-8 text file and tokenizes it with a vocabulary built
// from the whole text (tok nil) or with tok (resuming or evaluating a
// model). The first 90% of the tokens train, the last 10% validate
// (nanoGPT's split).
func LoadText(path string, tok *CharTokenizer) (*Corpus, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	text := string(b)
	if tok == nil {
		if tok, err = NewCharTokenizer(text); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	ids, err := tok.Encode(text)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	n := len(ids) * 9 / 10
	return &Corpus{Tok: tok, Train: ids[:n], Val: ids[n:]}, nil
}

// Blocks fills x and y, each batch×block, with batch random windows of
// tokens: row i of x is tokens[o_i : o_i+block] and row i of y the same
// window shifted by one (the next-token targets), o_i uniform in
// [0, len(tokens)−block) — nanoGPT's get_batch. The offsets come from a
// PCG seeded by (seed, draw), so a batch depends only on them: a resumed
// run and a reference implementation given the same numbers see the same
// batches.
func Blocks(tokens []int32, x, y []int32, batch, block int, seed, draw uint64) error {
	return BlockRows(tokens, x, y, batch, block, seed, draw, 0, batch)
}

// BlockRows fills x and y, each n×block, with rows [first, first+n) of
// the batch Blocks draws for (batch, seed, draw): a data-parallel rank's
// shard of the global batch (rank r of k takes first = r·batch/k). The
// offsets of the rows before first are drawn and skipped, so every shard
// comes from the same sequence of draws.
func BlockRows(tokens []int32, x, y []int32, batch, block int, seed, draw uint64, first, n int) error {
	if block < 1 || batch < 1 || first < 0 || n < 0 || first+n > batch || len(x) < n*block || len(y) < n*block {
		return fmt.Errorf("%w: rows [%d, %d) of a batch of %d × block %d into %d and %d tokens", ErrBatch, first, first+n,
			batch, block, len(x), len(y))
	}
	if len(tokens) <= block {
		return fmt.Errorf("%w: %d tokens make no window of %d+1", ErrText, len(tokens), block)
	}
	r := rand.New(rand.NewPCG(seed, draw))
	for i := 0; i < first+n; i++ {
		o := r.IntN(len(tokens) - block)
		if i < first {
			continue
		}
		k := i - first
		copy(x[k*block:(k+1)*block], tokens[o:o+block])
		copy(y[k*block:(k+1)*block], tokens[o+1:o+1+block])
	}
	return nil
}

// UnigramEntropy is the entropy in nats of the token frequencies of
// tokens: the validation loss of a model that ignores context.
func UnigramEntropy(tokens []int32, vocab int) float64 {
	counts := make([]float64, vocab)
	for _, t := range tokens {
		counts[t]++
	}
	var h float64
	n := float64(len(tokens))
	for _, c := range counts {
		if c > 0 {
			p := c / n
			h -= p * math.Log(p)
		}
	}
	return h
}
