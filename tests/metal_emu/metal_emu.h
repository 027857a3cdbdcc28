// Metal-emulation header: compiles Metal Shading Language kernels (as MLX's
// mx.fast.metal_kernel generates them) as host C++ and runs a dispatch on the CPU.
//
// Execution model
//   * Threadgroups run one after another; the threads of one threadgroup are fibers
//     (ucontext) on one host thread. The first runnable fiber in scan order runs until
//     it blocks at a barrier or a SIMD-group collective. Scheduling is deterministic;
//     the harness runs every dispatch twice, scanning from the lowest and from the
//     highest thread, and requires identical results: a thread that skips a barrier
//     runs ahead of every thread behind it, so a missing barrier shows up as wrong data
//     or as schedule-dependent data, every run.
//   * threadgroup_barrier waits for every thread of the group; simdgroup operations
//     (simd_sum, simd_shuffle, simdgroup_matrix multiply, matmul2d.run, ...) are
//     collectives of the 32 lanes of one SIMD-group. A barrier that some thread never
//     reaches is reported as a deadlock (an error), never a hang.
//   * Address spaces are real clang address spaces: device = 1, constant = 2,
//     threadgroup = 3, thread = the generic space. Passing a pointer of one space where
//     another is expected fails to compile, as it does with the Metal compiler.
//   * `threadgroup` arrays declared in a kernel body are rewritten to function-scope
//     statics by the harness (one group runs at a time, so a static is exactly one
//     copy per threadgroup); the harness fills them with a poison byte before each group.
//
// Anything not defined here does not compile: unsupported constructs fail loudly.
#pragma once

#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600  // macOS declares the ucontext routines only with it
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <ucontext.h>
#include <vector>


// Conversions clang emits calls to for __fp16 on x86 (round to nearest even).
extern "C" __attribute__((weak)) unsigned short __gnu_f2h_ieee(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (ax < 0x38800000u) {                        // half subnormal or zero
    float af;
    std::memcpy(&af, &ax, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(af * 16777216.0f));
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return static_cast<uint16_t>(sign | h);
}
extern "C" __attribute__((weak)) float __gnu_h2f_ieee(unsigned short h) {
  uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0) {
    float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  x = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// --------------------------------------------------------------------------------------
// Runtime: fibers, barriers, errors.
// --------------------------------------------------------------------------------------
namespace emu {

struct uvec3 { uint32_t x, y, z; };

// Every attribute MLX's metal_kernel may add to a signature (metal_kernel.cpp's list).
struct ThreadIds {
  uint32_t dispatch_quadgroups_per_threadgroup, dispatch_simdgroups_per_threadgroup;
  uvec3 dispatch_threads_per_threadgroup, grid_origin, grid_size;
  uint32_t quadgroup_index_in_threadgroup, quadgroups_per_threadgroup;
  uint32_t simdgroup_index_in_threadgroup, simdgroups_per_threadgroup;
  uint32_t thread_execution_width, thread_index_in_quadgroup, thread_index_in_simdgroup;
  uint32_t thread_index_in_threadgroup;
  uvec3 thread_position_in_grid, thread_position_in_threadgroup;
  uvec3 threadgroup_position_in_grid, threadgroups_per_grid, threads_per_grid;
  uint32_t threads_per_simdgroup;
  uvec3 threads_per_threadgroup;
};

struct Barrier {
  int expected = 0;
  int arrived = 0;
  unsigned gen = 0;
  const char* what = "";
};

enum State { READY, WAITING, DONE };

struct Fiber {
  ucontext_t ctx;
  char* stack = nullptr;
  State state = READY;
  Barrier* wait_on = nullptr;
  unsigned wait_gen = 0;
  ThreadIds ids;
  uint32_t lane = 0, simd = 0;
};

constexpr int kSimdWidth = 32;
constexpr size_t kStack = 256 * 1024;
constexpr int kMaxThreads = 1024;

// Per-SIMD-group staging for collectives. Two buffers, alternated by the barrier's
// generation: a lane can only reach collective n+2 after every lane has left n+1,
// hence after every lane has read collective n's buffer.
struct SimdStage {
  Barrier bar;
  alignas(16) unsigned char vals[2][kSimdWidth][32];
  double ma[2][16 * 32], mb[2][16 * 32], mc[2][16 * 32];
};

struct Runtime {
  ucontext_t sched;
  std::vector<Fiber> fibers;
  std::vector<SimdStage> simds;
  Barrier group_bar;
  Fiber* cur = nullptr;
  bool failed = false;
  std::string error;
  void (*body)(const ThreadIds&, void**) = nullptr;
  void** bufs = nullptr;
};

inline Runtime& rt() {
  static Runtime r;
  return r;
}

inline void yield_to_scheduler() {
  Runtime& r = rt();
  swapcontext(&r.cur->ctx, &r.sched);
}

// Record an error and stop this dispatch. Never returns inside a kernel thread.
[[noreturn]] inline void fail(const std::string& msg) {
  Runtime& r = rt();
  if (!r.failed) {
    r.failed = true;
    r.error = msg;
  }
  if (r.cur) {
    r.cur->state = DONE;
    swapcontext(&r.cur->ctx, &r.sched);
  }
  std::fprintf(stderr, "metal_emu: %s\n", msg.c_str());
  std::abort();
}

inline Fiber& self() {
  Runtime& r = rt();
  if (!r.cur) fail("a kernel-only operation ran outside a kernel thread");
  return *r.cur;
}

// Arrive at `b` and wait until every expected thread has arrived.
inline unsigned arrive_and_wait(Barrier& b) {
  Fiber& f = self();
  unsigned g = b.gen;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    b.gen++;
  } else {
    f.state = WAITING;
    f.wait_on = &b;
    f.wait_gen = g;
  }
  yield_to_scheduler();  // always yield so lower-numbered threads run first again
  return g;
}

inline SimdStage& my_simd() { return rt().simds[self().simd]; }

inline void fiber_entry() {
  Runtime& r = rt();
  Fiber* f = r.cur;
  r.body(f->ids, r.bufs);
  f->state = DONE;
  swapcontext(&f->ctx, &r.sched);
}

// Run a whole dispatch. grid = threads per dimension (MLX's dispatch_threads),
// tg = threads per threadgroup. Returns 0 or -1 with the message in r.error.
// `reset_group` is called before each threadgroup (threadgroup-memory poison);
// `policy` picks the scan order of the scheduler (0: lowest thread first, 1: highest).
inline int launch(uvec3 grid, uvec3 tg, void (*body)(const ThreadIds&, void**), void** bufs,
                  void (*reset_group)(), int policy) {
  Runtime& r = rt();
  r.failed = false;
  r.error.clear();
  r.body = body;
  r.bufs = bufs;
  uint32_t nthreads = tg.x * tg.y * tg.z;
  if (nthreads == 0 || nthreads > kMaxThreads) {
    r.error = "threadgroup size " + std::to_string(nthreads) + " outside 1..1024";
    return -1;
  }
  if (grid.x % tg.x || grid.y % tg.y || grid.z % tg.z) {
    r.error = "non-uniform threadgroups (grid not a multiple of the threadgroup) are not emulated";
    return -1;
  }
  uvec3 ngroups{grid.x / tg.x, grid.y / tg.y, grid.z / tg.z};
  uint32_t nsimd = (nthreads + kSimdWidth - 1) / kSimdWidth;
  r.fibers.assign(nthreads, Fiber());
  r.simds.assign(nsimd, SimdStage());
  for (auto& f : r.fibers) f.stack = static_cast<char*>(std::malloc(kStack));
  int rc = 0;
  for (uint32_t gz = 0; gz < ngroups.z && rc == 0; ++gz)
    for (uint32_t gy = 0; gy < ngroups.y && rc == 0; ++gy)
      for (uint32_t gx = 0; gx < ngroups.x && rc == 0; ++gx) {
        if (reset_group) reset_group();
        r.group_bar = Barrier();
        r.group_bar.expected = nthreads;
        r.group_bar.what = "threadgroup_barrier";
        for (uint32_t s = 0; s < nsimd; ++s) {
          r.simds[s].bar = Barrier();
          r.simds[s].bar.expected = std::min<uint32_t>(kSimdWidth, nthreads - s * kSimdWidth);
          r.simds[s].bar.what = "a SIMD-group collective";
        }
        for (uint32_t i = 0; i < nthreads; ++i) {
          Fiber& f = r.fibers[i];
          f.state = READY;
          f.wait_on = nullptr;
          ThreadIds& t = f.ids;
          std::memset(&t, 0, sizeof(t));
          uint32_t lx = i % tg.x, ly = (i / tg.x) % tg.y, lz = i / (tg.x * tg.y);
          t.thread_position_in_threadgroup = {lx, ly, lz};
          t.threadgroup_position_in_grid = {gx, gy, gz};
          t.thread_position_in_grid = {gx * tg.x + lx, gy * tg.y + ly, gz * tg.z + lz};
          t.threads_per_threadgroup = tg;
          t.dispatch_threads_per_threadgroup = tg;
          t.threadgroups_per_grid = ngroups;
          t.threads_per_grid = grid;
          t.grid_size = grid;
          t.grid_origin = {0, 0, 0};
          t.thread_index_in_threadgroup = i;
          t.simdgroup_index_in_threadgroup = i / kSimdWidth;
          t.thread_index_in_simdgroup = i % kSimdWidth;
          t.simdgroups_per_threadgroup = nsimd;
          t.dispatch_simdgroups_per_threadgroup = nsimd;
          t.quadgroup_index_in_threadgroup = i / 4;
          t.thread_index_in_quadgroup = i % 4;
          t.quadgroups_per_threadgroup = (nthreads + 3) / 4;
          t.dispatch_quadgroups_per_threadgroup = (nthreads + 3) / 4;
          t.thread_execution_width = kSimdWidth;
          t.threads_per_simdgroup = kSimdWidth;
          f.lane = i % kSimdWidth;
          f.simd = i / kSimdWidth;
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack;
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = nullptr;
          makecontext(&f.ctx, fiber_entry, 0);
        }
        // Always run the first runnable thread in scan order (lowest index first, or
        // highest first with `policy` 1) until it blocks. The first runnable thread thus
        // runs ahead of everyone behind it as far as the synchronisation allows, which
        // is what makes a missing barrier visible: with one order the producer side of
        // a hazard lags, with the other the consumer side does.
        for (;;) {
          Fiber* next = nullptr;
          for (uint32_t j = 0; j < nthreads; ++j) {
            Fiber& f = r.fibers[policy == 1 ? nthreads - 1 - j : j];
            if (f.state == DONE) continue;
            if (f.state == WAITING && f.wait_on->gen == f.wait_gen) continue;
            next = &f;
            break;
          }
          if (next == nullptr) {
            uint32_t waiting = 0, exited = 0;
            const char* what = "";
            for (auto& f : r.fibers) {
              if (f.state == WAITING) { waiting++; what = f.wait_on->what; }
              if (f.state == DONE) exited++;
            }
            if (waiting == 0) break;  // every thread is done
            // Nobody can move: some thread waits at a barrier another will never reach.
            r.error = "deadlock in threadgroup (" + std::to_string(gx) + "," + std::to_string(gy) +
                      "," + std::to_string(gz) + "): " + std::to_string(waiting) +
                      " threads wait at " + what + " that " + std::to_string(exited) +
                      " exited threads never reach (barrier in divergent control flow)";
            rc = -1;
            break;
          }
          next->state = READY;
          r.cur = next;
          swapcontext(&r.sched, &next->ctx);
          r.cur = nullptr;
          if (r.failed) { rc = -1; break; }
        }
      }
  for (auto& f : r.fibers) std::free(f.stack);
  r.fibers.clear();
  return rc;
}

}  // namespace emu

// --------------------------------------------------------------------------------------
// Metal types and functions (the subset the kernels use).
// --------------------------------------------------------------------------------------
namespace metal {

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

// ---- half: clang's __fp16, a storage type whose arithmetic is done in float (Metal
// rounds half arithmetic to half; the kernels here convert to float before arithmetic).
// Conversions round to nearest even (the two helpers below, which clang calls for
// __fp16 on x86). bfloat has no scalar type here: the kernels carry bfloat16 as uint16
// bits, and a kernel naming bfloat16_t fails to compile.
typedef __fp16 half;

// ---- vectors (members x, y, z, w; element-wise arithmetic not emulated). Aligned as
// Metal aligns them (a 3-vector like a 4-vector), so a vector load through a cast
// pointer has Metal's alignment requirement.
template <class T, int N> struct vec;
// Copies out of device / constant / threadgroup memory (a vector load through a pointer).
// Metal requires such an address to be aligned to the vector's alignment (a char4 load
// from a 4-byte aligned address only); a misaligned one is an error here.
inline void check_vector_align(unsigned long address, unsigned long align) {
  if (address % align)
    emu::fail("misaligned vector load: address " + std::to_string(address) + " is not a multiple of " +
              std::to_string(align) + " (Metal vector types must be aligned to their size)");
}
#define EMU_VEC_LOADS(...)                                                            \
  vec(const vec&) = default;                                                          \
  vec& operator=(const vec&) = default;                                               \
  vec(const __attribute__((address_space(1))) vec& o) : vec(__VA_ARGS__) {            \
    check_vector_align((unsigned long)&o, alignof(vec));                              \
  }                                                                                   \
  vec(const __attribute__((address_space(2))) vec& o) : vec(__VA_ARGS__) {            \
    check_vector_align((unsigned long)&o, alignof(vec));                              \
  }                                                                                   \
  vec(const __attribute__((address_space(3))) vec& o) : vec(__VA_ARGS__) {            \
    check_vector_align((unsigned long)&o, alignof(vec));                              \
  }
template <class T> struct alignas(sizeof(T) * 2) vec<T, 2> {
  EMU_VEC_LOADS(T(o.x), T(o.y))
  T x, y;
  vec() = default;
  constexpr vec(const T& v) : x(v), y(v) {}
  constexpr vec(const T& a, const T& b) : x(a), y(b) {}
  T& operator[](int i) { return i == 0 ? x : y; }
  const T& operator[](int i) const { return i == 0 ? x : y; }
};
template <class T> struct alignas(sizeof(T) * 4) vec<T, 3> {
  EMU_VEC_LOADS(T(o.x), T(o.y), T(o.z))
  T x, y, z;
  vec() = default;
  constexpr vec(const T& v) : x(v), y(v), z(v) {}
  constexpr vec(const T& a, const T& b, const T& c) : x(a), y(b), z(c) {}
  vec(emu::uvec3 u) : x(T(u.x)), y(T(u.y)), z(T(u.z)) {}
  T& operator[](int i) { return i == 0 ? x : (i == 1 ? y : z); }
  const T& operator[](int i) const { return i == 0 ? x : (i == 1 ? y : z); }
};
template <class T> struct alignas(sizeof(T) * 4) vec<T, 4> {
  EMU_VEC_LOADS(T(o.x), T(o.y), T(o.z), T(o.w))
  T x, y, z, w;
  vec() = default;
  constexpr vec(const T& v) : x(v), y(v), z(v), w(v) {}
  constexpr vec(const T& a, const T& b, const T& c, const T& d) : x(a), y(b), z(c), w(d) {}
  T& operator[](int i) { return i == 0 ? x : (i == 1 ? y : (i == 2 ? z : w)); }
  const T& operator[](int i) const { return i == 0 ? x : (i == 1 ? y : (i == 2 ? z : w)); }
};
#define EMU_VEC(T, P) typedef vec<T, 2> P##2; typedef vec<T, 3> P##3; typedef vec<T, 4> P##4;
EMU_VEC(float, float) EMU_VEC(int, int) EMU_VEC(uint, uint) EMU_VEC(short, short)
EMU_VEC(ushort, ushort) EMU_VEC(ulong, ulong) EMU_VEC(half, half)
EMU_VEC(int8_t, char) EMU_VEC(uchar, uchar)
#undef EMU_VEC

// ---- math (IEEE, round to nearest even: no fast math).
template <class T> inline T max(T a, T b) { return a > b ? a : b; }
template <class T> inline T min(T a, T b) { return a < b ? a : b; }
inline float max(float a, float b) { return std::fmax(a, b); }  // Metal: fmax semantics
inline float min(float a, float b) { return std::fmin(a, b); }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float fmin(float a, float b) { return std::fmin(a, b); }
template <class T> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
inline float abs(float x) { return std::fabs(x); }
inline int abs(int x) { return x < 0 ? -x : x; }
inline float fabs(float x) { return std::fabs(x); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }  // one rounding, as Metal's fma
inline float rint(float x) { return std::nearbyint(x); }  // default mode: half to even
inline float floor(float x) { return std::floor(x); }
inline float ceil(float x) { return std::ceil(x); }
inline bool isfinite(float x) { return std::isfinite(x); }
inline bool isnan(float x) { return std::isnan(x); }
inline bool isinf(float x) { return std::isinf(x); }
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
namespace precise {
inline float divide(float a, float b) { return a / b; }  // IEEE division
}  // namespace precise
template <class T, class U> inline T as_type(U u) {
  static_assert(sizeof(T) == sizeof(U), "as_type: sizes differ");
  T t;
  std::memcpy(&t, &u, sizeof(T));
  return t;
}

// ---- barriers.
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
// Execution barriers. Memory ordering is not modelled (fibers on one core see every
// write at once); the harness rejects, statically, a kernel that shares threadgroup
// memory under `mem_none` barriers only.
inline void threadgroup_barrier(mem_flags) { emu::arrive_and_wait(emu::rt().group_bar); }
inline void simdgroup_barrier(mem_flags) { emu::arrive_and_wait(emu::my_simd().bar); }

// ---- SIMD-group value collectives. Every lane of the SIMD-group must take part
// (uniform control flow); a lane that does not is reported as a deadlock.
namespace detail {
template <class T> inline unsigned publish(const T& v) {
  static_assert(sizeof(T) <= 32, "simd collective on a value wider than 32 bytes");
  emu::SimdStage& s = emu::my_simd();
  unsigned buf = s.bar.gen & 1u;
  std::memcpy(s.vals[buf][emu::self().lane], &v, sizeof(T));
  emu::arrive_and_wait(s.bar);
  return buf;
}
template <class T> inline T lane_value(unsigned buf, uint32_t lane) {
  T v;
  std::memcpy(&v, emu::my_simd().vals[buf][lane], sizeof(T));
  return v;
}
inline int active_lanes() { return emu::my_simd().bar.expected; }
}  // namespace detail

template <class T> inline T simd_sum(T v) {
  unsigned b = detail::publish(v);
  T acc = detail::lane_value<T>(b, 0);
  for (int l = 1; l < detail::active_lanes(); ++l) acc = acc + detail::lane_value<T>(b, l);
  return acc;
}
template <class T> inline T simd_max(T v) {
  unsigned b = detail::publish(v);
  T acc = detail::lane_value<T>(b, 0);
  for (int l = 1; l < detail::active_lanes(); ++l) acc = max(acc, detail::lane_value<T>(b, l));
  return acc;
}
template <class T> inline T simd_min(T v) {
  unsigned b = detail::publish(v);
  T acc = detail::lane_value<T>(b, 0);
  for (int l = 1; l < detail::active_lanes(); ++l) acc = min(acc, detail::lane_value<T>(b, l));
  return acc;
}
template <class T> inline T simd_shuffle(T v, ushort lane) {
  unsigned b = detail::publish(v);
  if (lane >= detail::active_lanes()) emu::fail("simd_shuffle from an inactive lane");
  return detail::lane_value<T>(b, lane);
}
template <class T> inline T simd_broadcast(T v, ushort lane) { return simd_shuffle(v, lane); }
template <class T> inline T simd_shuffle_xor(T v, ushort mask) {
  unsigned b = detail::publish(v);
  uint32_t src = emu::self().lane ^ mask;
  if (src >= uint32_t(detail::active_lanes())) emu::fail("simd_shuffle_xor from an inactive lane");
  return detail::lane_value<T>(b, src);
}
template <class T> inline T simd_shuffle_down(T v, ushort delta) {
  unsigned b = detail::publish(v);
  uint32_t src = emu::self().lane + delta;  // the upper `delta` lanes keep their own value
  return src < uint32_t(detail::active_lanes()) ? detail::lane_value<T>(b, src) : v;
}

// ---- simdgroup_matrix (8x8). Each lane holds two elements, in the per-lane layout
// MLX's steel/gemm/mma.h assumes; only thread_elements() exposes it.
// Element types: Metal has half, float and bfloat matrices only (no integer matrices);
// bfloat has no scalar type here, so half and float are the emulated ones. A matrix
// declared without an initialiser holds NaN (poison), never zeros.
namespace detail {
template <class T> constexpr bool is_matrix_elem = std::is_same_v<T, half> || std::is_same_v<T, float>;
}  // namespace detail

template <class T, int Cols, int Rows> struct simdgroup_matrix {
  static_assert(detail::is_matrix_elem<T>,
                "simdgroup_matrix element type must be half, float or bfloat (Metal has no integer matrices)");
  static_assert(Cols == 8 && Rows == 8, "only 8x8 simdgroup matrices are emulated");
  vec<T, 2> e;
  simdgroup_matrix() { std::memset(&e, 0xFF, sizeof(e)); }  // all-ones bytes: NaN
  explicit simdgroup_matrix(const T& diag) {  // Metal: a diagonal matrix
    auto rc = coord();
    e.x = rc.x == rc.y ? diag : T(0);
    e.y = rc.x == rc.y + 1 ? diag : T(0);
  }
  vec<T, 2>& thread_elements() { return e; }
  // (row, col) of this lane's first element; the second is at (row, col + 1).
  static vec<int, 2> coord() {
    int lane = int(emu::self().lane);
    int qid = lane / 4;
    int row = (qid & 4) + (lane / 2) % 4;
    int col = (qid & 2) * 2 + (lane % 2) * 2;
    return vec<int, 2>(row, col);
  }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int C, int R> inline simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(const T& v) {
  simdgroup_matrix<T, C, R> m;
  m.e = vec<T, 2>(v);
  return m;
}

// Loads and stores as Metal declares them: the pointee type is the matrix's element
// type and the pointer is `device` or `threadgroup` (a `thread` pointer, a `constant`
// one or another element type does not match, as with the Metal compiler). Each lane
// moves its own two elements; element (r, c) is src[r * elements_per_row + c], or
// src[c * elements_per_row + r] with transpose. A non-zero matrix_origin fails.
namespace detail {
template <class T, class P>
inline void sg_load(simdgroup_matrix<T, 8, 8>& m, P src, ulong elements_per_row, ulong2 origin, bool transpose) {
  if (origin.x || origin.y) emu::fail("simdgroup_load with a matrix_origin is not emulated");
  auto rc = simdgroup_matrix<T, 8, 8>::coord();
  for (int i = 0; i < 2; ++i) {
    ulong r = rc.x, c = rc.y + i;
    m.e[i] = transpose ? src[c * elements_per_row + r] : src[r * elements_per_row + c];
  }
}
template <class T, class P>
inline void sg_store(const simdgroup_matrix<T, 8, 8>& m, P dst, ulong elements_per_row, ulong2 origin, bool transpose) {
  if (origin.x || origin.y) emu::fail("simdgroup_store with a matrix_origin is not emulated");
  auto rc = simdgroup_matrix<T, 8, 8>::coord();
  for (int i = 0; i < 2; ++i) {
    ulong r = rc.x, c = rc.y + i;
    (transpose ? dst[c * elements_per_row + r] : dst[r * elements_per_row + c]) = m.e[i];
  }
}
}  // namespace detail
template <class T>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, const __attribute__((address_space(1))) T* src,
                           ulong elements_per_row = 8, ulong2 matrix_origin = ulong2(0), bool transpose = false) {
  detail::sg_load(m, src, elements_per_row, matrix_origin, transpose);
}
template <class T>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, const __attribute__((address_space(3))) T* src,
                           ulong elements_per_row = 8, ulong2 matrix_origin = ulong2(0), bool transpose = false) {
  detail::sg_load(m, src, elements_per_row, matrix_origin, transpose);
}
template <class T>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, __attribute__((address_space(1))) T* dst,
                            ulong elements_per_row = 8, ulong2 matrix_origin = ulong2(0), bool transpose = false) {
  detail::sg_store(m, dst, elements_per_row, matrix_origin, transpose);
}
template <class T>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, __attribute__((address_space(3))) T* dst,
                            ulong elements_per_row = 8, ulong2 matrix_origin = ulong2(0), bool transpose = false) {
  detail::sg_store(m, dst, elements_per_row, matrix_origin, transpose);
}

namespace detail {
// Gather an 8x8 matrix from all lanes into `out` (row-major).
template <class T> inline void publish8(double* out, const simdgroup_matrix<T, 8, 8>& m) {
  auto rc = simdgroup_matrix<T, 8, 8>::coord();
  out[rc.x * 8 + rc.y] = double(float(m.e.x));
  out[rc.x * 8 + rc.y + 1] = double(float(m.e.y));
}
}  // namespace detail

// D = A * B + C, a collective of the SIMD-group. Each product of two half or float
// elements is formed in float and added in float32, in k order, rounding after every
// addition (the hardware's order is unspecified; this is no more precise than it).
// Integer-valued sums are exact below 2^24 and round above it, as on the GPU.
template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b,
                                          const simdgroup_matrix<TC, 8, 8>& c) {
  emu::SimdStage& s = emu::my_simd();
  unsigned buf = s.bar.gen & 1u;
  detail::publish8(s.ma[buf], a);
  detail::publish8(s.mb[buf], b);
  detail::publish8(s.mc[buf], c);
  emu::arrive_and_wait(s.bar);
  auto rc = simdgroup_matrix<TD, 8, 8>::coord();
  for (int i = 0; i < 2; ++i) {
    int r = rc.x, col = rc.y + i;
    volatile float acc = float(s.mc[buf][r * 8 + col]);
    for (int k = 0; k < 8; ++k) {
      volatile float p = float(s.ma[buf][r * 8 + k]) * float(s.mb[buf][k * 8 + col]);
      acc = acc + p;
    }
    d.e[i] = TD(float(acc));
  }
}
template <class TD, class TA, class TB>
inline void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                               const simdgroup_matrix<TB, 8, 8>& b) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<TD, 8, 8>(TD(0)));
}

// Packed sub-byte element formats of Metal 4 (right operands of matmul2d): tags only,
// so the type table can name them; no arithmetic or storage is emulated.
struct int4b_format {};
struct uint4b_format {};
struct int2b_format {};
struct uint2b_format {};

struct execution_simdgroup {};
struct execution_simdgroups {};
template <class T> struct remove_addrspace { typedef T type; };
template <class T> using remove_addrspace_t = typename remove_addrspace<T>::type;

}  // namespace metal

// --------------------------------------------------------------------------------------
// MetalPerformancePrimitives: matmul2d with cooperative tensors, SIMD-group scope.
//
// Emulated: descriptor (16, 32, 16), transpose_right false or true (transpose_left
// fails), execution_simdgroup, modes multiply and multiply_accumulate, and the element
// type combinations of the table in Apple's MPPTensorOpsMatMul2d.h (26.x SDK, read from
// a public copy of the header) that have a host type here: half, float, int8_t, uint8_t,
// int32_t. Integer rows: int8_t x int8_t, uint8_t x uint8_t, int8_t x int4b/int2b_format
// and uint8_t x uint4b/uint2b_format, all -> int32_t (signedness matches; int8_t x
// uint8_t is not in that table). The packed formats are accepted by the type check
// (detail::type_ok) but a cooperative tensor of one fails to compile: their element
// semantics are not emulated. bfloat and the fp4/fp8 formats have no host type. Any
// other combination fails to compile. Integer
// products are exact with int32 wrap-around; float ones are summed in float32.
// Per-lane layout, as MLX's steel/gemm/nax.h uses it: a 16x16 fragment gives lane l the
// elements (fm + 8 i, fn + j), i < 2, j < 4, at index 4 i + j, with qid = l / 4,
// fm = (qid & 4) | ((l / 2) & 3), fn = ((qid & 2) | (l & 1)) * 4. The left operand
// (16 x 16, rows m, columns k) is one fragment; the right operand is two: without
// transpose (rows k, columns n) n 0..15 at indices 0..7 and 16..31 at 8..15; with
// transpose_right (rows n, columns k) n 0..15 at indices 0..7 and 16..31 at 8..15. The
// destination (rows m, columns n) is two, as the untransposed right operand. Fresh
// cooperative tensors hold poison (0xA5 bytes), never zeros.
// --------------------------------------------------------------------------------------
// Declared only in the C++20 build the harness uses for sources that include
// <MetalPerformancePrimitives/MetalPerformancePrimitives.h> (as on Metal, where matmul2d
// exists only with that include).
#if __cplusplus >= 202002L
namespace mpp {
namespace tensor_ops {

struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };
  int m, n, k;
  bool transpose_left, transpose_right, relaxed_precision;
  mode matmul_mode;
  constexpr matmul2d_descriptor(int m_, int n_, int k_, bool tl = false, bool tr = false,
                                bool relaxed = false, mode md = mode::multiply)
      : m(m_), n(n_), k(k_), transpose_left(tl), transpose_right(tr), relaxed_precision(relaxed),
        matmul_mode(md) {}
};

namespace detail {
template <class A, class B> constexpr bool same = std::is_same_v<A, B>;
// Apple's table (MPPTensorOpsMatMul2d.h), restricted to types with a host spelling.
template <class T> constexpr bool packed_signed = same<T, metal::int4b_format> || same<T, metal::int2b_format>;
template <class T> constexpr bool packed_unsigned = same<T, metal::uint4b_format> || same<T, metal::uint2b_format>;
template <class T> constexpr bool packed = packed_signed<T> || packed_unsigned<T>;
template <class L, class R, class D> constexpr bool type_ok() {
  using metal::half;
  if constexpr (packed<R>) {  // packed right operands: integer rows to int32, half rows to half / float
    if constexpr (same<L, int8_t>) return packed_signed<R> && same<D, int32_t>;
    else if constexpr (same<L, uint8_t>) return packed_unsigned<R> && same<D, int32_t>;
    else return same<L, half> && (same<D, half> || same<D, float>);
  }
  constexpr bool i8 = same<L, int8_t> && same<R, int8_t>;
  constexpr bool u8 = same<L, uint8_t> && same<R, uint8_t>;
  if (i8 || u8) return same<D, int32_t>;
  constexpr bool lf = same<L, half> || same<L, float> || same<L, int8_t> || same<L, uint8_t>;
  constexpr bool rf = same<R, half> || same<R, float> || same<R, int8_t> || same<R, uint8_t>;
  if (!lf || !rf) return false;
  constexpr bool lint = same<L, int8_t> || same<L, uint8_t>, rint_ = same<R, int8_t> || same<R, uint8_t>;
  if (lint && rint_) return false;  // mixed-signedness or integer x integer to a float type
  if (same<D, float>) return true;  // every remaining pair has a float destination
  if (same<D, half>) {              // half destinations: half with half or an 8-bit integer
    return (same<L, half> && (same<R, half> || rint_)) || (lint && same<R, half>);
  }
  return false;
}
}  // namespace detail

template <class T, int N> struct cooperative_tensor {
  T v[N];
  cooperative_tensor() { std::memset(v, 0xA5, sizeof(v)); }
  T& operator[](int i) {
    if (i < 0 || i >= N) emu::fail("cooperative tensor index out of range");
    return v[i];
  }
  const T& operator[](int i) const { return v[i]; }
  static constexpr int get_capacity() { return N; }
};

namespace detail {
// Matrix coordinate (row, col) of element `idx` of a 16 x (16 * frags) fragment set.
inline void coord(int idx, int& row, int& col) {
  int lane = int(emu::self().lane);
  int qid = lane >> 2;
  int fm = (qid & 4) | ((lane >> 1) & 3);
  int fn = ((qid & 2) | (lane & 1)) * 4;
  int frag = idx / 8, e = idx % 8;
  row = fm + (e / 4) * 8;
  col = frag * 16 + fn + e % 4;
}
}  // namespace detail

template <matmul2d_descriptor D, class Scope> struct matmul2d {
  static_assert(D.m == 16 && D.n == 32 && D.k == 16, "matmul2d: only 16x32x16 is emulated");
  static_assert(!D.transpose_left, "matmul2d: a transposed left operand is not emulated");
  static_assert(std::is_same_v<Scope, metal::execution_simdgroup>, "matmul2d: only execution_simdgroup is emulated");

  template <class TA, class TB, class TC> cooperative_tensor<TA, 8> get_left_input_cooperative_tensor() {
    static_assert(detail::type_ok<TA, TB, TC>(), "matmul2d: element types not in Apple's matmul2d type table");
    return {};
  }
  template <class TA, class TB, class TC> cooperative_tensor<TB, 16> get_right_input_cooperative_tensor() {
    static_assert(detail::type_ok<TA, TB, TC>(), "matmul2d: element types not in Apple's matmul2d type table");
    static_assert(!detail::packed<TB>, "matmul2d: packed sub-byte right operands are not emulated");
    return {};
  }
  template <class CTA, class CTB, class TC> cooperative_tensor<TC, 16> get_destination_cooperative_tensor() {
    return {};
  }

  template <class TA, class TB, class TC>
  void run(const cooperative_tensor<TA, 8>& a, const cooperative_tensor<TB, 16>& b, cooperative_tensor<TC, 16>& c) {
    static_assert(detail::type_ok<TA, TB, TC>(), "matmul2d: element types not in Apple's matmul2d type table");
    constexpr bool ints = std::is_integral_v<TA> && std::is_integral_v<TB>;
    emu::SimdStage& s = emu::my_simd();
    unsigned buf = s.bar.gen & 1u;
    int row, col;
    // ma: A as [m][k] (16 x 16); mb: B as [k][n] (16 x 32) whatever the register layout.
    for (int i = 0; i < 8; ++i) { detail::coord(i, row, col); s.ma[buf][row * 16 + col] = double(a.v[i]); }
    for (int i = 0; i < 16; ++i) {
      detail::coord(i, row, col);
      if constexpr (D.transpose_right) {
        int n = (i / 8) * 16 + row, k = col - (i / 8) * 16;  // fragment f: rows n, columns k
        s.mb[buf][k * 32 + n] = double(b.v[i]);
      } else {
        s.mb[buf][row * 32 + col] = double(b.v[i]);
      }
    }
    emu::arrive_and_wait(s.bar);
    for (int i = 0; i < 16; ++i) {
      detail::coord(i, row, col);
      if constexpr (ints) {
        int64_t acc = D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate ? int64_t(c.v[i]) : 0;
        for (int k = 0; k < 16; ++k)
          acc += int64_t(s.ma[buf][row * 16 + k]) * int64_t(s.mb[buf][k * 32 + col]);
        c.v[i] = TC(int32_t(uint32_t(acc)));  // int32 wrap-around, as the hardware's adder
      } else {
        volatile float acc = D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate ? float(c.v[i]) : 0.0f;
        for (int k = 0; k < 16; ++k) {
          volatile float p = float(s.ma[buf][row * 16 + k]) * float(s.mb[buf][k * 32 + col]);
          acc = acc + p;
        }
        c.v[i] = TC(float(acc));
      }
    }
  }
};

}  // namespace tensor_ops
}  // namespace mpp
#endif  // C++20: MetalPerformancePrimitives

// --------------------------------------------------------------------------------------
// Metal spellings. After this point `device`, `constant`, `threadgroup` and `thread`
// are address-space qualifiers, as in Metal.
// --------------------------------------------------------------------------------------
typedef metal::half float16_t;
using namespace metal;

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define METAL_FUNC inline
