package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSummaryAndPlot: two runs' metrics give the steps and seconds at
// which the second first reaches the baseline's best validation loss (not
// its final one: the baseline overfits), over the baseline's own, and a
// PNG; a run that never reaches it has no ratio.
func TestSummaryAndPlot(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := write("adamw.jsonl", `{"step":10,"loss":3.0,"lr":0.001}
{"step":100,"val_loss":2.0,"elapsed_s":10}
{"step":200,"val_loss":1.5,"elapsed_s":20}
{"step":300,"val_loss":1.7,"elapsed_s":30}
`)
	other := write("soap.jsonl", `{"step":100,"val_loss":1.6,"elapsed_s":12}
{"step":150,"val_loss":1.45,"elapsed_s":18}
{"step":200,"val_loss":1.3,"elapsed_s":24}
`)
	never := write("muon.jsonl", `{"step":100,"val_loss":1.6,"elapsed_s":9}
{"step":200,"val_loss":1.55,"elapsed_s":18}
`)
	var rs []run
	for _, a := range [][2]string{{"adamw", base}, {"soap", other}, {"muon", never}} {
		r, err := read(a[0], a[1])
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	s := summarise(rs)
	if *s[0].StepsToBase != 200 || *s[1].StepsToBase != 150 || *s[1].SecsToBase != 18 || *s[1].StepRatio != 0.75 || *s[1].TimeRatio != 0.9 {
		t.Errorf("summaries %+v %+v", s[0], s[1])
	}
	if s[1].BestValLoss != 1.3 || s[1].FinalValLoss != 1.3 || s[0].BestValLoss != 1.5 || s[0].FinalValLoss != 1.7 || s[1].BaseLoss != 1.5 {
		t.Errorf("best/final %+v %+v", s[0], s[1])
	}
	if s[2].StepsToBase != nil || s[2].TimeRatio != nil {
		t.Errorf("a run above the baseline's best got %+v", s[2])
	}
	out := filepath.Join(dir, "optim.png")
	os.Args = []string{"gpukit-optimplot", "-o", out, "adamw=" + base, "soap=" + other}
	if err := run1(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Size() < 1000 {
		t.Fatalf("png: %v %v", fi, err)
	}
}
