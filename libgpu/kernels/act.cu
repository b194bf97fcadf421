// act.cu: the act family (libgpu/ops/act.go): the device side of HRM's
// adaptive computation time (sapientinc/HRM, models/hrm/hrm_act_v1.py and
// models/losses.py ACTLossHead; Graves 2016's ACT with a Q-learning halting
// head), so that a training segment step and an evaluation segment decide
// halting, refill halted slots and keep their metrics with no host round
// trip:
//
//   act_reset_*     w[b] = halted[b] ? init : z[b]        (the carry reset)
//   act_load        halted slots take pool slot (cursor mod R); tokens and
//                   targets of every slot (position 0: the puzzle token,
//                   target −1 = ignored)
//   act_correct_*   per-cell argmax, correct cells, exact sequences
//   act_targets_*   the Q targets: halt ← exact, continue ← σ(next max Q)
//   act_halt_*      steps, halted, the step's metrics, cursor += 1
//   act_schedule    the learning-rate scale of the next step (warmup, cosine)
//   act_eval_*      evaluation: stop, freeze answers, the loop's flag
//   act_put_*       dx[:, pos] (+)= src, zero elsewhere (LinearAt's backward)
//   act_qloss_*     the Q losses (binary cross-entropy with logits) and their
//                   gradient in PyTorch's f32 arithmetic
//
// Every kernel takes the one struct act_args (each uses a subset). Sums
// are in double in a fixed order (bitwise reproducible); integer counts
// are exact.
#include "common.cuh"

struct act_args {
  void* w;                       // reset: state [n]; put: dx [B, T, C] (strides s0, s1)
  const void* z;                 // reset: carry [n]; put: src [B, C]
  const float* init;             // reset: [C]
  int* halted;                   // [B] 0/1
  int* steps;                    // [B]
  int* cursor;                   // [1] segment steps taken
  const unsigned char* pool_in;  // [R, B, T−1] tokens
  const unsigned char* pool_lab; // [R, B, T−1]
  const int* pool_mh;            // [R, B] exploration draws, or null
  unsigned char* cur_in;         // [B, T−1]
  unsigned char* cur_lab;        // [B, T−1]
  int* tokens;                   // [B, T]
  int* targets;                  // [B, T]
  const void* logits;            // [B, T, V] (strides s0, s1)
  int* pred;                     // [B, T]
  int* correct;                  // [B]
  int* exact;                    // [B]
  const void* q;                 // [B, 2] (halt, continue)
  float* qt;                     // [B, 2] targets
  float* metrics;                // [ACT_METRICS]
  const float* lm_loss;          // [1] or null
  const float* q_loss;           // [1] or null
  float* lr_scale;               // [1]
  int* done;                     // [B]
  int* used;                     // [B]
  int* answer;                   // [B, T]
  int* seg;                      // [1]
  int* cond;                     // [1]
  long long n;
  long long s0, s1;
  double warmup, total, min_ratio;
  int B, T, C, L, V;
  int slots, max_steps, puzzle_tok, pos;
  int explore, halting, acc;
  float scale;
};
static_assert(sizeof(act_args) == 328, "act_args layout: launch.ActArgs is generated from it (go generate ./libgpu/kernels/launch)");

// The metrics vector (ops.ACTLoss ... ops.ACTLRScale).
#define ACT_METRICS 10

__device__ __forceinline__ double act_bce(double x, double y) {
  return fmax(x, 0.0) - x * y + log1p(exp(-fabs(x)));
}

// act_sigmoid is the logistic function in f32, as act_targets and
// act_qloss both compute it: the Q-continue gradient σ(q) − target is then
// exactly 0 where the target is σ of the same value (PyTorch's f32
// arithmetic gives that 0; a gradient from rounding noise would become a
// full step of a scale-invariant update such as Adam-atan2).
__device__ __forceinline__ float act_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// act_blk_sum_i / act_blk_sum_d: the sum over a block (size a multiple of
// 32, at most 1024) returned to every thread, in a fixed order.
__device__ __forceinline__ int act_blk_sum_i(int v, int* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  int t = lane < nw ? sh[lane] : 0;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

__device__ __forceinline__ double act_blk_sum_d(double v, double* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double t = lane < nw ? sh[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

template <typename T>
__device__ void act_reset(const act_args& a) {
  T* w = static_cast<T*>(a.w);
  const T* z = static_cast<const T*>(a.z);
  const long long per = (long long)a.T * a.C;
  GPUKIT_GRID_STRIDE(i, a.n) {
    const long long b = (long long)i / per;
    const int c = (int)((long long)i % a.C);
    const float v = a.halted[b] ? a.init[c] : gpukit_ld(z + i);
    gpukit_st(w + i, v);
  }
}

extern "C" __global__ void act_load(const __grid_constant__ act_args a) {
  const int slot = a.cursor[0] % a.slots;
  const long long L = a.T - 1;
  GPUKIT_GRID_STRIDE(i, (long long)a.B * a.T) {
    const long long b = (long long)i / a.T, t = (long long)i % a.T;
    const bool h = a.halted[b] != 0;
    if (t == 0) {
      if (h) a.steps[b] = 0;
      a.tokens[i] = a.puzzle_tok;
      a.targets[i] = -1;
      continue;
    }
    const long long c = b * L + (t - 1);
    if (h) {
      const long long p = ((long long)slot * a.B + b) * L + (t - 1);
      a.cur_in[c] = a.pool_in[p];
      a.cur_lab[c] = a.pool_lab[p];
    }
    a.tokens[i] = a.cur_in[c];
    a.targets[i] = a.cur_lab[c];
  }
}

template <typename T>
__device__ void act_correct(const act_args& a) {
  __shared__ int sh[32];
  const T* x = static_cast<const T*>(a.logits);
  for (long long b = blockIdx.x; b < a.B; b += gridDim.x) {
    int ok = 0, valid = 0;
    for (int t = threadIdx.x; t < a.T; t += blockDim.x) {
      const T* row = x + b * a.s0 + (long long)t * a.s1;
      int best = 0;
      float bv = gpukit_ld(row);
      for (int v = 1; v < a.V; v++) {
        const float u = gpukit_ld(row + v);
        if (u > bv) {
          bv = u;
          best = v;
        }
      }
      a.pred[b * a.T + t] = best;
      const int tg = a.targets[b * a.T + t];
      if (tg >= 0) {
        valid++;
        ok += best == tg;
      }
    }
    ok = act_blk_sum_i(ok, sh);
    valid = act_blk_sum_i(valid, sh);
    if (threadIdx.x == 0) {
      a.correct[b] = ok;
      a.exact[b] = ok == valid;
    }
  }
}

template <typename T>
__device__ void act_targets(const act_args& a) {
  const T* qn = static_cast<const T*>(a.q);
  GPUKIT_GRID_STRIDE(b, a.B) {
    a.qt[2 * b] = a.exact[b] ? 1.0f : 0.0f;
    const float h = gpukit_ld(qn + 2 * b), c = gpukit_ld(qn + 2 * b + 1);
    const bool last = a.steps[b] + 1 >= a.max_steps;
    const float x = last ? h : (c > h ? c : h);
    a.qt[2 * b + 1] = act_sigmoid(x);
  }
}

template <typename T>
__device__ void act_halt(const act_args& a) {
  __shared__ double sh[32];
  const T* q = static_cast<const T*>(a.q);
  const int cur = a.cursor[0];
  const int slot = a.slots > 0 ? cur % a.slots : 0;
  double s[7] = {0, 0, 0, 0, 0, 0, 0};  // count, accuracy, exact, q-halt accuracy, steps, q-halt loss, q-continue loss
  for (int b = threadIdx.x; b < a.B; b += blockDim.x) {
    const int st = a.steps[b] + 1;
    a.steps[b] = st;
    const float qh = gpukit_ld(q + 2 * b), qc = gpukit_ld(q + 2 * b + 1);
    bool h = st >= a.max_steps;
    if (a.explore) {
      const int mh = a.pool_mh ? a.pool_mh[(long long)slot * a.B + b] : 0;
      h = (h || qh > qc) && st >= mh;
    }
    a.halted[b] = h;
    const int ex = a.exact[b] != 0;
    if (h) {
      s[0] += 1;
      s[1] += (double)a.correct[b] / (double)a.L;
      s[2] += ex;
      s[3] += (qh >= 0.0f) == (ex != 0);
      s[4] += st;
    }
    s[5] += act_bce(qh, a.qt[2 * b]);
    s[6] += act_bce(qc, a.qt[2 * b + 1]);
  }
  for (int k = 0; k < 7; k++) s[k] = act_blk_sum_d(s[k], sh);
  if (threadIdx.x == 0) {
    const double cnt = s[0] > 1 ? s[0] : 1;
    const double lm = a.lm_loss ? (double)a.lm_loss[0] : 0.0, ql = a.q_loss ? (double)a.q_loss[0] : 0.0;
    float* m = a.metrics;
    m[0] = (float)(lm + ql);
    m[1] = (float)lm;
    m[2] = (float)(s[5] / a.B);
    m[3] = (float)(s[6] / a.B);
    m[4] = (float)s[0];
    m[5] = (float)(s[1] / cnt);
    m[6] = (float)(s[2] / cnt);
    m[7] = (float)(s[3] / cnt);
    m[8] = (float)(s[4] / cnt);
    m[9] = a.lr_scale ? a.lr_scale[0] : 1.0f;
    a.cursor[0] = cur + 1;
  }
}

extern "C" __global__ void act_schedule(const __grid_constant__ act_args a) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const double s = (double)a.cursor[0] + 1;
  double r;
  if (s < a.warmup) {
    r = s / fmax(1.0, a.warmup);
  } else {
    const double p = (s - a.warmup) / fmax(1.0, a.total - a.warmup);
    r = a.min_ratio + fmax(0.0, (1 - a.min_ratio) * 0.5 * (1 + cos(3.14159265358979323846 * p)));
  }
  a.lr_scale[0] = (float)r;
}

template <typename T>
__device__ void act_eval(const act_args& a) {
  __shared__ int sh[32];
  const T* q = static_cast<const T*>(a.q);
  const int sg = a.seg[0];
  int running = 0;
  for (int b = threadIdx.x; b < a.B; b += blockDim.x) {
    const bool stop = sg + 1 >= a.max_steps || (a.halting && gpukit_ld(q + 2 * b) > gpukit_ld(q + 2 * b + 1));
    if (stop && !a.done[b]) {
      a.done[b] = 1;
      a.used[b] = sg + 1;
    }
    running += !a.done[b];
  }
  __syncthreads();
  for (long long i = threadIdx.x; i < (long long)a.B * a.T; i += blockDim.x) {
    if (a.used[i / a.T] == sg + 1) a.answer[i] = a.pred[i];
  }
  running = act_blk_sum_i(running, sh);
  if (threadIdx.x == 0) {
    a.seg[0] = sg + 1;
    a.cond[0] = running > 0 && sg + 1 < a.max_steps ? running : 0;
  }
}

template <typename T>
__device__ void act_put(const act_args& a) {
  T* dx = static_cast<T*>(a.w);
  const T* src = static_cast<const T*>(a.z);
  if (a.acc) {
    GPUKIT_GRID_STRIDE(i, (long long)a.B * a.C) {
      const long long b = (long long)i / a.C, c = (long long)i % a.C;
      T* p = dx + b * a.s0 + (long long)a.pos * a.s1 + c;
      gpukit_st(p, gpukit_ld(p) + gpukit_ld(src + i));
    }
    return;
  }
  GPUKIT_GRID_STRIDE(i, (long long)a.B * a.T * a.C) {
    const long long c = (long long)i % a.C, r = (long long)i / a.C;
    const long long t = r % a.T, b = r / a.T;
    gpukit_st(dx + b * a.s0 + t * a.s1 + c, t == a.pos ? gpukit_ld(src + b * a.C + c) : 0.0f);
  }
}

template <typename T>
__device__ void act_qloss(const act_args& a) {
  __shared__ double sh[32];
  const T* x = static_cast<const T*>(a.q);
  T* dx = static_cast<T*>(a.w);
  double s = 0.0;
  for (long long i = threadIdx.x; i < a.n; i += blockDim.x) {
    const float xi = gpukit_ld(x + i), yi = a.qt[i];
    s += act_bce((double)xi, (double)yi);
    if (dx) {
      float d = (act_sigmoid(xi) - yi) * a.scale;
      if (a.acc) d += gpukit_ld(dx + i);
      gpukit_st(dx + i, d);
    }
  }
  s = act_blk_sum_d(s, sh);
  if (threadIdx.x == 0 && a.metrics) a.metrics[0] = (float)((double)a.scale * s);
}

#define ACT_INSTANCES(SUF, T)                                                                              \
  extern "C" __global__ void act_reset##SUF(const __grid_constant__ act_args a) { act_reset<T>(a); }      \
  extern "C" __global__ void act_correct##SUF(const __grid_constant__ act_args a) { act_correct<T>(a); }  \
  extern "C" __global__ void act_targets##SUF(const __grid_constant__ act_args a) { act_targets<T>(a); }  \
  extern "C" __global__ void __launch_bounds__(1024) act_halt##SUF(const __grid_constant__ act_args a) {  \
    act_halt<T>(a);                                                                                        \
  }                                                                                                        \
  extern "C" __global__ void __launch_bounds__(1024) act_eval##SUF(const __grid_constant__ act_args a) {  \
    act_eval<T>(a);                                                                                        \
  }                                                                                                        \
  extern "C" __global__ void act_put##SUF(const __grid_constant__ act_args a) { act_put<T>(a); }          \
  extern "C" __global__ void __launch_bounds__(1024) act_qloss##SUF(const __grid_constant__ act_args a) { \
    act_qloss<T>(a);                                                                                       \
  }

ACT_INSTANCES(_f32, float)
ACT_INSTANCES(_bf16, gpukit_bf16)
