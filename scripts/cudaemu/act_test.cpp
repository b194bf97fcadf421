// act_test.cpp: runs libgpu/kernels/act.cu under the host emulation
// (emu.h) with the launch geometry of libgpu/ops/act.go (256-thread grids
// for the element-wise kernels, 128-thread blocks per sequence for
// act_correct, one 1024-thread block for act_halt and act_eval) and checks
// every kernel against a plain C++ reference of hrm_act_v1.py's rules:
// exact integers, metrics to 1e-6. Batches larger than a block and
// strided logits; warps scheduled in random orders, so a missing
// __syncthreads in a block reduction shows up. Usage: scripts/cuda-emu.sh act
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/act.cu"
// clang-format on
#include "emutest.h"

static int irand(int lo, int hi) { return lo + (int)(rng() % (unsigned)(hi - lo + 1)); }

template <typename V>
static void same(const std::string& what, const V& got, const V& want) {
  bool ok = got == want;
  printf("%-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) failures++;
}

static unsigned grid256(long long n) { return (unsigned)std::max(1LL, std::min((n + 255) / 256, 65535LL)); }

static void reset_case(bool bf) {
  const int B = 5, T = 7, C = 12;
  const long long n = (long long)B * T * C;
  Buf w, z, init;
  w.alloc(n, bf);
  z.alloc(n, bf);
  init.alloc(C, false);
  std::vector<double> zv = z.fill(n, 1), iv = init.fill(C, 1);
  std::vector<int> halted(B);
  for (int b = 0; b < B; b++) halted[b] = b % 2;
  act_args a = {};
  a.w = w.ptr();
  a.z = z.ptr();
  a.init = init.f();
  a.halted = halted.data();
  a.n = n;
  a.B = B, a.T = T, a.C = C;
  emu::launch({grid256(n), 1, 1}, {256, 1, 1}, 0, seed++, [&] { bf ? act_reset_bf16(a) : act_reset_f32(a); });
  std::vector<double> want(n);
  for (long long i = 0; i < n; i++) {
    double v = halted[i / (T * C)] ? iv[i % C] : zv[i];
    want[i] = bf ? gpukit_bf16_to_f32(gpukit_f32_to_bf16((float)v)) : (double)(float)v;
  }
  check(std::string("reset ") + (bf ? "bf16" : "f32"), w.read(n), want, 0);
}

static void load_case() {
  const int R = 3, B = 6, L = 9, T = L + 1;
  std::vector<unsigned char> pin(R * B * L), plab(R * B * L), cin(B * L), clab(B * L);
  for (auto* v : {&pin, &plab, &cin, &clab})
    for (auto& x : *v) x = (unsigned char)irand(1, 10);
  std::vector<int> halted(B), steps(B), tokens(B * T, -99), targets(B * T, -99), cursor = {8};
  for (int b = 0; b < B; b++) halted[b] = irand(0, 1), steps[b] = irand(0, 15);
  halted[0] = 1;
  std::vector<unsigned char> wcin = cin, wclab = clab;
  std::vector<int> wsteps = steps, wtok, wtg;
  const int slot = cursor[0] % R;
  for (int b = 0; b < B; b++) {
    if (halted[b]) {
      wsteps[b] = 0;
      for (int i = 0; i < L; i++) wcin[b * L + i] = pin[(slot * B + b) * L + i], wclab[b * L + i] = plab[(slot * B + b) * L + i];
    }
    wtok.push_back(11);
    wtg.push_back(-1);
    for (int i = 0; i < L; i++) wtok.push_back(wcin[b * L + i]), wtg.push_back(wclab[b * L + i]);
  }
  act_args a = {};
  a.halted = halted.data(), a.steps = steps.data(), a.cursor = cursor.data();
  a.pool_in = pin.data(), a.pool_lab = plab.data(), a.cur_in = cin.data(), a.cur_lab = clab.data();
  a.tokens = tokens.data(), a.targets = targets.data();
  a.B = B, a.T = T, a.slots = R, a.puzzle_tok = 11;
  emu::launch({grid256(B * T), 1, 1}, {256, 1, 1}, 0, seed++, [&] { act_load(a); });
  same("load tokens", tokens, wtok);
  same("load targets", targets, wtg);
  same("load steps", steps, wsteps);
  same("load inputs", cin, wcin);
  same("load labels", clab, wclab);
}

static void correct_case(bool bf) {
  const int B = 7, T = 82, V = 11, ld = V + 3;
  Buf x;
  x.alloc((size_t)B * T * ld, bf);
  for (size_t i = 0; i < (size_t)B * T * ld; i++) x.set(i, irand(-2, 2));
  std::vector<int> targets(B * T), pred(B * T, -9), correct(B, -9), exact(B, -9);
  std::vector<int> wp, wc, we;
  for (int b = 0; b < B; b++) {
    int ok = 0, valid = 0;
    for (int t = 0; t < T; t++) {
      int best = 0;
      for (int v = 1; v < V; v++)
        if (x.get((size_t)(b * T + t) * ld + v) > x.get((size_t)(b * T + t) * ld + best)) best = v;
      wp.push_back(best);
      int tg = irand(-1, V - 1);
      if (b < 2 && tg >= 0) tg = best;  // two exact sequences
      targets[b * T + t] = tg;
      if (tg >= 0) valid++, ok += tg == best;
    }
    wc.push_back(ok);
    we.push_back(ok == valid);
  }
  act_args a = {};
  a.logits = x.ptr(), a.targets = targets.data(), a.pred = pred.data(), a.correct = correct.data(), a.exact = exact.data();
  a.s0 = (long long)T * ld, a.s1 = ld;
  a.B = B, a.T = T, a.V = V;
  emu::launch({(unsigned)B, 1, 1}, {128, 1, 1}, 0, seed++, [&] { bf ? act_correct_bf16(a) : act_correct_f32(a); });
  const char* d = bf ? " bf16" : " f32";
  same(std::string("correct pred") + d, pred, wp);
  same(std::string("correct counts") + d, correct, wc);
  same(std::string("correct exact") + d, exact, we);
  if (we[0] != 1) printf("note: sequence 0 not exact\n");
}

static double sig(double x) { return 1 / (1 + exp(-x)); }
static double bce(double x, double y) { return -y * log(sig(x)) - (1 - y) * log(1 - sig(x)); }

static void targets_halt_case(bool bf, bool explore) {
  const int R = 3, B = 1100, cells = 81, maxs = 6;
  Buf q, qn, qt;
  q.alloc(2 * B, bf);
  qn.alloc(2 * B, bf);
  qt.alloc(2 * B, false);
  std::vector<double> qv = q.fill(2 * B, 2), qnv = qn.fill(2 * B, 2);
  std::vector<int> halted(B), steps(B), correct(B), exact(B), mh(R * B), cursor = {irand(0, 9)};
  for (int b = 0; b < B; b++) halted[b] = irand(0, 1), steps[b] = irand(0, maxs - 1), correct[b] = irand(0, cells), exact[b] = irand(0, 1);
  for (auto& m : mh) m = irand(0, maxs);
  act_args a = {};
  a.qt = qt.f(), a.exact = exact.data(), a.q = qn.ptr(), a.steps = steps.data(), a.B = B, a.max_steps = maxs;
  emu::launch({grid256(B), 1, 1}, {256, 1, 1}, 0, seed++, [&] { bf ? act_targets_bf16(a) : act_targets_f32(a); });
  std::vector<double> wqt(2 * B);
  for (int b = 0; b < B; b++) {
    wqt[2 * b] = exact[b];
    double x = steps[b] + 1 >= maxs ? qnv[2 * b] : std::max(qnv[2 * b], qnv[2 * b + 1]);
    wqt[2 * b + 1] = sig(x);
  }
  const char* d = bf ? " bf16" : " f32";
  check(std::string("targets") + d, qt.read(2 * B), wqt, 1e-6);
  std::vector<double> qtv = qt.read(2 * B);

  float lm = 1.25f, ql = 0.5f, lr = 0.375f;
  Buf metrics;
  metrics.alloc(ACT_METRICS, false);
  std::vector<int> wh(B), ws(B);
  double s[7] = {0};
  const int slot = cursor[0] % R;
  for (int b = 0; b < B; b++) {
    ws[b] = steps[b] + 1;
    bool h = ws[b] >= maxs;
    if (explore) h = (h || qv[2 * b] > qv[2 * b + 1]) && ws[b] >= mh[slot * B + b];
    wh[b] = h;
    if (h) s[0]++, s[1] += (double)correct[b] / cells, s[2] += exact[b], s[3] += (qv[2 * b] >= 0) == (exact[b] != 0), s[4] += ws[b];
    s[5] += bce(qv[2 * b], qtv[2 * b]);
    s[6] += bce(qv[2 * b + 1], qtv[2 * b + 1]);
  }
  double cnt = std::max(s[0], 1.0);
  std::vector<double> wm = {lm + ql, lm, s[5] / B, s[6] / B, s[0], s[1] / cnt, s[2] / cnt, s[3] / cnt, s[4] / cnt, lr};
  std::vector<int> wcur = {cursor[0] + 1};
  a = {};
  a.halted = halted.data(), a.steps = steps.data(), a.cursor = cursor.data(), a.pool_mh = mh.data(), a.q = q.ptr(), a.qt = qt.f();
  a.correct = correct.data(), a.exact = exact.data(), a.metrics = metrics.f(), a.lm_loss = &lm, a.q_loss = &ql, a.lr_scale = &lr;
  a.B = B, a.L = cells, a.slots = R, a.max_steps = maxs, a.explore = explore;
  emu::launch({1, 1, 1}, {1024, 1, 1}, 0, seed++, [&] { bf ? act_halt_bf16(a) : act_halt_f32(a); });
  std::string e = std::string(d) + (explore ? " explore" : "");
  same("halt halted" + e, halted, wh);
  same("halt steps" + e, steps, ws);
  same("halt cursor" + e, cursor, wcur);
  check("halt metrics" + e, metrics.read(ACT_METRICS), wm, 1e-6);
}

static void schedule_case() {
  struct {
    int cur;
    double warmup, total, min;
  } cs[] = {{0, 2000, 1e5, 1}, {1999, 2000, 1e5, 1}, {7, 4, 20, 0.1}, {40, 4, 20, 0}, {0, 0, 10, 1}};
  for (auto& c : cs) {
    std::vector<int> cursor = {c.cur};
    float scale = NAN;
    act_args a = {};
    a.cursor = cursor.data(), a.lr_scale = &scale, a.warmup = c.warmup, a.total = c.total, a.min_ratio = c.min;
    emu::launch({1, 1, 1}, {32, 1, 1}, 0, seed++, [&] { act_schedule(a); });
    double s = c.cur + 1, want;
    if (s < c.warmup)
      want = s / std::max(1.0, c.warmup);
    else
      want = c.min + std::max(0.0, (1 - c.min) * 0.5 * (1 + cos(M_PI * (s - c.warmup) / std::max(1.0, c.total - c.warmup))));
    check("schedule at cursor " + std::to_string(c.cur), {scale}, {want}, 1e-7);
  }
}

static void eval_case(bool bf, bool halting) {
  const int B = 1030, T = 4, maxs = 4;
  std::vector<int> done(B, 0), used(B, 0), answer(B * T, -7), seg = {0}, cond = {-1};
  std::vector<int> wdone = done, wused = used, wanswer = answer;
  int wseg = 0;
  Buf q;
  q.alloc(2 * B, bf);
  for (int k = 0; k < maxs; k++) {
    std::vector<double> qv = q.fill(2 * B, 1);
    std::vector<int> pred(B * T);
    for (auto& p : pred) p = irand(0, 10);
    int s = wseg + 1, running = 0;
    for (int b = 0; b < B; b++) {
      bool stop = s >= maxs || (halting && qv[2 * b] > qv[2 * b + 1]);
      if (stop && !wdone[b]) {
        wdone[b] = 1, wused[b] = s;
        for (int t = 0; t < T; t++) wanswer[b * T + t] = pred[b * T + t];
      }
      running += !wdone[b];
    }
    wseg = s;
    std::vector<int> wcond = {running > 0 && s < maxs ? running : 0};
    act_args a = {};
    a.q = q.ptr(), a.pred = pred.data(), a.answer = answer.data(), a.done = done.data(), a.used = used.data();
    a.seg = seg.data(), a.cond = cond.data(), a.B = B, a.T = T, a.max_steps = maxs, a.halting = halting;
    emu::launch({1, 1, 1}, {1024, 1, 1}, 0, seed++, [&] { bf ? act_eval_bf16(a) : act_eval_f32(a); });
    std::string e = std::string(bf ? " bf16" : " f32") + (halting ? " halting" : "") + " segment " + std::to_string(k);
    same("eval done" + e, done, wdone);
    same("eval used" + e, used, wused);
    same("eval answer" + e, answer, wanswer);
    same("eval cond" + e, cond, wcond);
    same("eval seg" + e, seg, std::vector<int>{wseg});
  }
}

static void put_case(bool bf, bool acc) {
  const int B = 3, T = 5, C = 6, ld = C + 2, pos = 2;
  Buf dx, src;
  dx.alloc((size_t)B * T * ld, bf);
  src.alloc(B * C, bf);
  std::vector<double> old = dx.fill(B * T * ld, 1), sv = src.fill(B * C, 1), want = old;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        size_t i = (size_t)(b * T + t) * ld + c;
        double v = acc ? old[i] : 0;
        if (t == pos) v += sv[b * C + c];
        want[i] = bf ? gpukit_bf16_to_f32(gpukit_f32_to_bf16((float)v)) : (double)(float)v;
      }
  act_args a = {};
  a.w = dx.ptr(), a.z = src.ptr(), a.s0 = (long long)T * ld, a.s1 = ld, a.B = B, a.T = T, a.C = C, a.pos = pos, a.acc = acc;
  long long n = (long long)B * C * (acc ? 1 : T);
  emu::launch({grid256(n), 1, 1}, {256, 1, 1}, 0, seed++, [&] { bf ? act_put_bf16(a) : act_put_f32(a); });
  check(std::string("put") + (bf ? " bf16" : " f32") + (acc ? " acc" : ""), dx.read(B * T * ld), want, 0);
}

static void qloss_case(bool bf, bool acc) {
  const int n = 2 * 700;
  const float scale = 0.5f / 700;
  Buf q, y, dq;
  q.alloc(n, bf);
  y.alloc(n, false);
  dq.alloc(n, bf);
  std::vector<double> qv = q.fill(n, 3), old = acc ? dq.fill(n, 1) : std::vector<double>(n, 0);
  for (int i = 0; i < n; i++) y.set(i, i % 2 ? (double)(rng() % 1000) / 1000 : (double)(rng() % 2));
  q.set(1, -5), q.set(0, -5), qv[0] = qv[1] = -5;
  y.set(1, 1.0f / (1.0f + expf(5.0f)));  // the continue target of q = (−5, −5): its gradient is exactly 0
  std::vector<double> yv = y.read(n), want(n);
  double loss = 0;
  for (int i = 0; i < n; i++) {
    loss += bce(qv[i], yv[i]);
    double d = scale * (sig(qv[i]) - yv[i]) + old[i];
    want[i] = bf ? gpukit_bf16_to_f32(gpukit_f32_to_bf16((float)d)) : d;
  }
  float got = NAN;
  act_args a = {};
  a.q = q.ptr(), a.qt = y.f(), a.w = dq.ptr(), a.metrics = &got, a.n = n, a.scale = scale, a.acc = acc;
  emu::launch({1, 1, 1}, {1024, 1, 1}, 0, seed++, [&] { bf ? act_qloss_bf16(a) : act_qloss_f32(a); });
  std::string e = std::string(bf ? " bf16" : " f32") + (acc ? " acc" : "");
  check("qloss loss" + e, {got}, {scale * loss}, 1e-6);
  check("qloss dq" + e, dq.read(n), want, bf ? 1e-2 : 1e-5);
  if (!acc && dq.get(1) != 0) {
    printf("FAIL qloss%s: the continue gradient at its own target is %g, not 0\n", e.c_str(), dq.get(1));
    failures++;
  }
}

int main() {
  for (bool bf : {false, true}) {
    reset_case(bf);
    correct_case(bf);
    for (bool ex : {false, true}) targets_halt_case(bf, ex);
    for (bool h : {false, true}) eval_case(bf, h);
    for (bool acc : {false, true}) put_case(bf, acc);
    for (bool acc : {false, true}) qloss_case(bf, acc);
  }
  load_case();
  schedule_case();
  return finish();
}
