/* kda_c.h: the C ABI of the KDA attention backend (backend/kda_backend.h), for engines that are
 * not C++ (Python over ctypes: python/kda/) or that want a stable symbol set.
 *
 * Every function returns an int status: KDA_OK (0) or one of the KDA_ERROR_* codes below
 * (kda::ErrorCode). On an error, kda_last_error() returns the message of this thread's failing
 * call (kda::Error::message(), verbatim: it names the call, the argument, what was expected and
 * what came) and nothing has changed (the C++ backend's guarantee; the ABI's own checks run
 * before any backend call). No C++ exception crosses this boundary.
 *
 * Tensors cross as DLPack DLTensors (dlpack.h, v0.6): dtype bfloat16 (kDLBfloat, 16 bits),
 * float32 (kDLFloat, 32) or int32 (kDLInt, 32), one lane; device kDLCPU or kDLCUDAHost (host)
 * or kDLCUDA (cuda:device_id); shape and strides in elements (strides NULL = compact row-major);
 * data + byte_offset is the first element. The ABI reads the DLTensor during the call only; the
 * memory it describes stays the caller's (ownership below).
 *
 * Ownership: the backend (kda_backend) owns its state pool and index buffers; destroy frees them.
 * Weights (kda_set_layer_weights) are kept as views: their memory must stay valid and unchanged
 * for as long as the backend may run that layer. Inputs, outputs, accepted lengths and tracks must
 * stay valid until the work enqueued on the stream has run (host kernel set: until the call
 * returns). Pool views (kda_pool_view) point into the backend's memory (an external pool's: the
 * engine's) and die with the backend. With kda_backend_options.allocator the backend's memory is
 * the engine's allocator's; with kda_backend_options.external_pool the state tensors are the
 * engine's (kept valid by it until destroy). The kda_op_* functions own nothing.
 *
 * Streams: `stream` is a cudaStream_t passed as void* (NULL = the legacy default stream); every
 * device operation is enqueued on it, as in the C++ API (no host synchronisation except
 * kda_check_device_errors). The host kernel set runs synchronously and ignores it.
 *
 * Threads: kda_last_error is per thread. A backend is driven by one thread at a time; distinct
 * backends are independent.
 *
 * Handles: a kda_backend* is an opaque token (not an address) that every call looks up in the
 * library's registry of live backends before anything else, so NULL, a destroyed handle (also
 * after other backends were created) and a value that never came from kda_backend_create return
 * KDA_ERROR_INVALID_ARGUMENT naming the call, and kda_backend_destroy of one does nothing (a
 * double destroy is a no-op).
 *
 * Undefined (the ABI cannot tell such pointers from good ones, so do not pass them): pointers
 * that are not what the call says they are: a DLTensor* (and its data, shape, strides) that does
 * not point at a DLTensor describing memory of that size, a host array (slots, rows, lengths,
 * offsets, parents, tracks) with fewer entries than its count, out pointers (out, slot, info,
 * state) that are not writable, strings without a terminating NUL; a backend used by two
 * threads at once, or destroyed while another thread is inside a call on it; pool views (and
 * their shape / strides) used after destroy; memory a call enqueued work on that is freed or
 * reused before the stream has run that work.
 */
#pragma once

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Bumped when a struct or a signature of this header changes (3: engine-owned memory in
 * kda_backend_options, kda_claim_slot, kda_memory_report_get, the kda_op_* functions; 4: the
 * outputs' numerics in kda_verify_op and kda_dispatch_info). */
#define KDA_C_ABI_VERSION 5

/* Status codes (kda::ErrorCode + 1; 0 = success). */
#define KDA_OK 0
#define KDA_ERROR_INVALID_ARGUMENT 1 /**< shape, dtype, stride, device, index or value */
#define KDA_ERROR_LIFECYCLE 2        /**< a call out of order (names the call and round state) */
#define KDA_ERROR_UNSUPPORTED 3      /**< valid, but this build or device cannot serve it */
#define KDA_ERROR_CUDA 4             /**< a CUDA runtime call failed */
#define KDA_ERROR_OUT_OF_MEMORY 5    /**< an allocation, the memory budget, or no free slot */
#define KDA_ERROR_IO 6               /**< a file could not be read or written */
#define KDA_ERROR_INTERNAL 7         /**< a broken invariant or an unexpected exception (a bug) */

/* kda_model_config.gate */
#define KDA_GATE_STANDARD 0 /**< Kimi-Linear: g = -exp(A_log) * softplus(a + dt_bias) */
#define KDA_GATE_SAFE 1     /**< Kimi-K3: g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias)) */

/* kda_model_config.conv_weight_dtype */
#define KDA_CONV_F32 0
#define KDA_CONV_BF16 1

/* kda_backend_info.record_mode */
#define KDA_MODE_SNAPSHOT 0
#define KDA_MODE_RING 1

/* kda_backend_info.draft_shape (kda::DraftShape, contract §8) */
#define KDA_DRAFT_DENSE 0  /**< T tokens per request, a chain */
#define KDA_DRAFT_RAGGED 1 /**< lengths[n] tokens per request, a chain */
#define KDA_DRAFT_TREE 2   /**< T nodes per request, each with a parent */

/* kda_verify_op.numerics (kda::NumericsRequest, --kda-verify-numerics; contract §10) */
#define KDA_NUMERICS_AUTO 0  /**< the measured table decides (no row for the shape: exact) */
#define KDA_NUMERICS_EXACT 1 /**< §3's exact outputs */
#define KDA_NUMERICS_FAST 2  /**< the fast outputs wherever the call can take them */

/** The backend: an opaque handle (a registry token, never dereferenced); made by
 * kda_backend_create, freed by kda_backend_destroy. */
typedef struct kda_backend kda_backend;

/** kda::ModelConfig (backend/model_config.h); validated by kda_backend_create. */
typedef struct {
  int32_t num_layers;        /**< KDA layers driven by this backend (>= 1) */
  int32_t H;                 /**< q/k heads */
  int32_t HV;                /**< v heads; HV % H == 0 */
  int32_t K;                 /**< head_k_dim: 64 or 128 */
  int32_t V;                 /**< head_v_dim */
  int32_t gate;              /**< KDA_GATE_STANDARD or KDA_GATE_SAFE */
  float lower_bound;         /**< safe gate only: finite and < 0 */
  int32_t conv_weight_dtype; /**< KDA_CONV_F32 or KDA_CONV_BF16 */
  int32_t has_conv_bias;     /**< 0 or 1 */
} kda_model_config;

/* kda_claim_slot's init (kda::SlotInit) */
#define KDA_SLOT_ZERO 0       /**< zeroed, as kda_allocate_slot */
#define KDA_SLOT_KEEP_STATE 1 /**< the engine's conv / SSM state kept (cursor, pending zeroed) */

/** The engine's allocator hook (kda::Allocator, core/allocator.h): the backend takes every byte of
 * memory it owns from `alloc` and returns it through `free` when destroyed. device_type is kDLCUDA
 * (device_id: the ordinal) or kDLCPU (the host kernel set); stream is the backend's
 * allocation_stream. alloc returns a block of `bytes` aligned to 256 bytes, or NULL when out of
 * memory (create then fails with KDA_ERROR_OUT_OF_MEMORY); free must not fail. `release` (may be
 * NULL) is called exactly once per kda_backend_create that was given the allocator: before create
 * returns when it fails (after freeing what it allocated), else after the last free, when the
 * destroyed backend no longer uses the allocator. The struct is copied by kda_backend_create; ctx
 * and the functions must stay valid until release (or, without release, until
 * kda_backend_destroy has returned). Called on the thread driving the backend (create and
 * destroy), never from inside a stream capture. */
typedef struct {
  void* ctx;
  void* (*alloc)(void* ctx, int64_t bytes, int32_t device_type, int32_t device_id, void* stream);
  void (*free)(void* ctx, void* ptr, int64_t bytes, int32_t device_type, int32_t device_id,
               void* stream);
  void (*release)(void* ctx);
} kda_allocator;

/** Pool / state tensors (contract §2; the rules of memory_pool/pool_storage.h, letters S, R, L,
 * T_max as there). NULL = absent. As kda_backend_options.external_pool: engine-owned tensors with
 * a leading [layers] dim that the backend uses in place of allocating its own (absent ones it
 * allocates). For kda_op_verify one layer's (no [layers] dim; ring_pending [S]); for kda_op_commit
 * and kda_op_materialize all layers' ([layers, ...]; ring_cursor [S] has no layer dim). */
typedef struct {
  const DLTensor* conv_state;   /**< [layers, S, W-1, D] bf16 */
  const DLTensor* ssm_state;    /**< [layers, S, HV, V, K] f32 */
  const DLTensor* conv_window;  /**< [layers, R, T_max, W-1, D] bf16 scratch */
  const DLTensor* snapshots;    /**< snapshot mode: [layers, R, T_max, HV, V, K] f32 */
  const DLTensor* ring_rawv;    /**< ring mode: [layers, S, HV, L, V] bf16 */
  const DLTensor* ring_rawk;    /**< ring mode: [layers, S, H, L, K] bf16 */
  const DLTensor* ring_g;       /**< ring mode: [layers, S, HV, L, K] f32 */
  const DLTensor* ring_beta;    /**< ring mode: [layers, S, HV, L] f32 */
  const DLTensor* ring_cursor;  /**< deferred (ops) / ring mode (pool): [S] int32 */
  const DLTensor* ring_pending; /**< deferred (ops) / ring mode (pool): [layers, S] int32 */
  const DLTensor* ring_u;       /**< deferred: [layers, S, HV, L, V] f32 */
  const DLTensor* qkv_act;      /**< [>= R*T_max (ops: N), D] bf16, the unfused path's scratch */
} kda_state_tensors;

/** kda::BackendOptions (NULL = defaults: all zero). */
typedef struct {
  int64_t memory_budget_bytes; /**< pool budget, 0 = none (kOutOfMemory above it) */
  int32_t extra_slots;         /**< slots beyond --max-running-requests */
  /** The engine's allocator (NULL: cudaMalloc / host memory); copied by create. */
  const kda_allocator* allocator;
  /** cudaStream_t of the allocator's calls and the pool's set-up (NULL: legacy default stream). */
  void* allocation_stream;
  /** Engine-owned pool tensors (NULL: none), validated by create (KDA_ERROR_INVALID_ARGUMENT
   * naming "external_pool.<tensor>", nothing allocated); their memory must stay valid until
   * kda_backend_destroy. Read during create only (the views are kept). */
  const kda_state_tensors* external_pool;
} kda_backend_options;

/** Bytes of a backend's memory, per part (kda_memory_report_get; kda::PoolMemoryReport). */
typedef struct {
  int64_t total_bytes;       /**< pool_bytes + workspace_bytes */
  int64_t pool_bytes;        /**< every pool tensor, whoever owns it */
  int64_t conv_state_bytes;  /**< [layers, S, W-1, D] bf16 */
  int64_t ssm_state_bytes;   /**< [layers, S, HV, V, K] f32 */
  int64_t ring_bytes;        /**< ring mode: rawv, rawk, g, beta (+ u), cursor, pending counts */
  int64_t conv_window_bytes; /**< [layers, R, T_max, W-1, D] bf16 */
  int64_t snapshot_bytes;    /**< snapshot mode: [layers, R, T_max, HV, V, K] f32 */
  int64_t qkv_act_bytes;     /**< [R*T_max, D] bf16 */
  int64_t workspace_bytes;   /**< the backend's index buffers, error flag, length scratch */
  int64_t allocated_bytes;   /**< allocated by the backend (cudaMalloc or the allocator) */
  int64_t external_bytes;    /**< in engine-owned tensors (external_pool) */
  int64_t bytes_per_slot;    /**< pool bytes per state slot (all layers) */
  int64_t bytes_per_row;     /**< pool bytes per scratch row (all layers) */
  int64_t snapshot_mode_total_bytes; /**< the pool in snapshot mode (same shape) */
  int64_t ring_mode_total_bytes;     /**< the pool in ring mode (same shape) */
  int32_t from_allocator; /**< 1: allocated_bytes came from kda_backend_options.allocator */
} kda_memory_report;

/** A batch's index tensors for the kda_op_* functions: int32, contiguous, on the state's device. */
typedef struct {
  int32_t T;                       /**< tokens (tree: nodes) per request, 1..T_max */
  const DLTensor* slots;           /**< [B]; -1 = padding row */
  const DLTensor* rows;            /**< [B] scratch rows in [0, R) (required) */
  const DLTensor* query_start_loc; /**< ragged chain: [B + 1] (NULL: dense) */
  const DLTensor* parents;         /**< tree: [B, T] or [B*T] (NULL: a chain) */
} kda_batch_tensors;

/** kda_op_verify's arguments (kda::ops::VerifyArgs). */
typedef struct {
  const DLTensor* mixed_qkv;   /**< [N, D] bf16, inner contiguous, row stride >= D */
  const DLTensor* a;           /**< [N, HV*K] bf16 */
  const DLTensor* b;           /**< [N, HV] bf16 */
  const DLTensor* out;         /**< [N, HV, V] bf16, contiguous */
  const DLTensor* A_log;       /**< [HV] f32 */
  const DLTensor* dt_bias;     /**< [HV*K] f32 */
  const DLTensor* conv_weight; /**< [D, 4] f32 or bf16 */
  const DLTensor* conv_bias;   /**< [D] as conv_weight, or NULL */
  kda_state_tensors state;     /**< one layer's */
  kda_batch_tensors batch;
  int32_t gate;                 /**< KDA_GATE_* */
  float lower_bound;            /**< safe gate only */
  int32_t fused_verify;         /**< 1: the fused kernel allowed, 0: unfused only */
  int32_t fused_ring_max_batch; /**< ring mode: largest B fused (--kda-fused-ring-max-batch) */
  int32_t block_v;              /**< fused V tile, 0 = auto (--kda-verify-block-v) */
  int32_t numerics;             /**< KDA_NUMERICS_* (--kda-verify-numerics); 0 = auto */
  /** 1: the state is the lazy write-back's (contract §11; ring_pending and ring_cursor given, no
   * ring_u): the verify folds nothing, its fast outputs take the pending steps as history
   * (numerics fast or auto). 0: eager or deferred, by the state's tensors. */
  int32_t lazy;
} kda_verify_op;

/** kda_op_commit's arguments (kda::ops::CommitArgs). */
typedef struct {
  kda_state_tensors state; /**< all layers' */
  kda_batch_tensors batch;
  const DLTensor* accepted_lengths; /**< [B] int32 */
  const DLTensor* accepted_paths;   /**< tree: [B, T] int32 (NULL: a chain) */
  const DLTensor* track_slots;      /**< optional [B] int32 (with track_steps) */
  const DLTensor* track_steps;      /**< optional [B] int32, -1 = no track */
  const DLTensor* checked_accepted; /**< ragged / tree: [B] int32 scratch */
  const DLTensor* error_flag;       /**< optional [1] int32: CommitError bits or-ed in */
  int32_t lazy;                     /**< 1: the lazy write-back's commit (kda_verify_op.lazy) */
  int32_t lazy_fold_interval;       /**< with lazy: also fold at this many pending steps (0..16) */
} kda_commit_op;

/** What kda_op_commit ran. */
typedef struct {
  int32_t deferred;   /**< 1: recorded the counts (deferred or lazy), 0: committed the state */
  const char* reason; /**< "ring_fold", "snapshot_copy", "deferred_record" or "lazy_record" */
} kda_commit_info;

/** What a verify chose (kda::DispatchDecision). */
typedef struct {
  int32_t fused;               /**< 1: fused kernel, 0: unfused */
  int32_t block_v;             /**< fused V tile, 0 when unfused */
  const char* reason;          /**< dispatch reason name (static string) */
  int32_t fast_outputs;        /**< 1: fast outputs (contract §10), 0: exact */
  const char* numerics_reason; /**< numerics reason name, e.g. "auto_unmeasured" (static) */
} kda_dispatch_info;

/** Configuration and round queries (kda_backend_info). */
typedef struct {
  int32_t num_layers;
  int32_t num_slots;          /**< S = --max-running-requests + extra_slots */
  int32_t num_rows;           /**< R = --max-running-requests */
  int32_t max_draft_tokens;   /**< T_max = --speculative-num-draft-tokens */
  int32_t ring_len;           /**< L (ring mode) */
  int32_t record_mode;        /**< KDA_MODE_SNAPSHOT or KDA_MODE_RING */
  int32_t deferred_commit;    /**< 1: commits are deferred (materialize before reading state) */
  int32_t device_type;        /**< kDLCPU (host kernel set) or kDLCUDA */
  int32_t device_id;          /**< CUDA ordinal; 0 for host */
  int32_t free_slots;         /**< slots allocate_slot can still hand out */
  int32_t batch_size;         /**< B of the prepared round, 0 when idle */
  int32_t tokens_per_request; /**< T of the prepared round, 0 when idle */
  int32_t draft_shape;        /**< KDA_DRAFT_* of the prepared verify round (DENSE otherwise) */
  int64_t batch_tokens;       /**< activation rows N of the prepared round, 0 when idle */
} kda_backend_info;

/** KDA_C_ABI_VERSION of the library (compare with the header's). */
int kda_abi_version(void);
/** This thread's last error message ("" when the last call succeeded); valid until this
 * thread's next kda_* call. */
const char* kda_last_error(void);
/** This thread's last status (KDA_OK when the last call succeeded). */
int kda_last_error_code(void);
/** "ok", "invalid_argument", "lifecycle", ... ("unknown" for other values). Static string. */
const char* kda_status_name(int status);

/** Creates a backend. `flags`: num_flags (>= 0) engine flags as on a command line (backend/flags.h:
 * "--speculative-num-draft-tokens", "4", "--enable-linear-replayssm-spec", ...; every entry must
 * be a flag of the module or its value). `device`: "host" (host reference kernels) or "cuda" /
 * "cuda:N" (the CUDA kernels on device N). `options` may be NULL. On success *out is the new
 * backend; on error *out is NULL. CUDA: allocates and zeroes the pool (synchronously). */
int kda_backend_create(const kda_model_config* model, const char* const* flags, int num_flags,
                       const char* device, const kda_backend_options* options, kda_backend** out);
/** Frees the backend and its pool (NULL: nothing). Work enqueued on a stream must have run. A
 * handle that is not live (destroyed, or never made by kda_backend_create) is left alone:
 * nothing happens, and kda_last_error_code() says KDA_ERROR_INVALID_ARGUMENT. */
void kda_backend_destroy(kda_backend* backend);

/** Layer `layer`'s weights: A_log [HV] f32, dt_bias [HV*K] f32, conv_weight [D, 4] and conv_bias
 * [D] (NULL iff the model has no bias) in the model's conv dtype, packed, on the backend's
 * device. Kept as views (see ownership). */
int kda_set_layer_weights(kda_backend* backend, int layer, const DLTensor* A_log,
                          const DLTensor* dt_bias, const DLTensor* conv_weight,
                          const DLTensor* conv_bias);

/** A zeroed state slot in *slot (KDA_ERROR_OUT_OF_MEMORY when none is free). */
int kda_allocate_slot(kda_backend* backend, void* stream, int32_t* slot);
/** The engine's own slot number `slot` becomes allocated (kda::KdaAttentionBackend::claim_slot):
 * init KDA_SLOT_ZERO (zeroed, enqueued on stream) or KDA_SLOT_KEEP_STATE (its conv / SSM state,
 * written by the engine, kept). KDA_ERROR_INVALID_ARGUMENT: outside [0, S) or allocated. */
int kda_claim_slot(kda_backend* backend, int32_t slot, int32_t init, void* stream);
/** Frees `slot` (not while it is in a round's batch). */
int kda_release_slot(kda_backend* backend, int32_t slot);
/** dst's committed state (and pending deferred steps) become src's (contract §9). */
int kda_copy_slot(kda_backend* backend, int32_t src, int32_t dst, void* stream);

/** Starts a verify round: B requests of T tokens; slots[B] (-1 = padding row); rows[B] the
 * scratch rows or NULL (= batch positions). Host arrays, read during the call. */
int kda_prepare(kda_backend* backend, int32_t T, const int32_t* slots, int32_t B,
                const int32_t* rows, void* stream);
/** Starts a verify round with a draft shape (contract §8; kda::BatchSpec): as kda_prepare, and
 * lengths [B] (a ragged chain: request n verifies lengths[n] tokens in [1, T]; its token t is
 * activation row offsets[n] + t, N = the sum of the lengths), offsets [B + 1] (with lengths,
 * optional: SGLang's query_start_loc, the packed prefix sums of lengths; NULL = those), parents
 * [B*T] (a tree of T nodes per request, --speculative-eagle-topk > 1: parents[n*T + j] is node
 * j's parent within request n, -1 for node 0 only, else in [0, j); commit with kda_commit_tree).
 * lengths and parents are not both given; all NULL is kda_prepare. Host arrays, read during the
 * call. */
int kda_prepare_shaped(kda_backend* backend, int32_t T, const int32_t* slots, int32_t B,
                       const int32_t* rows, const int32_t* lengths, const int32_t* offsets,
                       const int32_t* parents, void* stream);
/** Starts an extend (prefill) round of B requests with T prompt tokens each. track_slots and
 * track_steps ([B] host arrays, both or neither): prefix-cache tracks (kda::ExtendTrack). */
int kda_prepare_extend(kda_backend* backend, int32_t T, const int32_t* slots, int32_t B,
                       const int32_t* track_slots, const int32_t* track_steps, void* stream);

/** Verifies layer `layer` of the prepared round: mixed_qkv [N, D], a [N, HV*K], b [N, HV] bf16
 * (inner dim contiguous), out [N, HV, V] bf16 packed; N = B*T, or the sum of a ragged round's
 * lengths (kda_backend_info.batch_tokens). `info` may be NULL. */
int kda_verify(kda_backend* backend, int layer, const DLTensor* mixed_qkv, const DLTensor* a,
               const DLTensor* b, const DLTensor* out, void* stream, kda_dispatch_info* info);
/** Runs the prepared extend round on layer `layer` (same tensors as kda_verify). */
int kda_extend(kda_backend* backend, int layer, const DLTensor* mixed_qkv, const DLTensor* a,
               const DLTensor* b, const DLTensor* out, void* stream);

/** Commits every layer: accepted_lengths [B] int32 on the backend's device, contiguous. */
int kda_commit(kda_backend* backend, const DLTensor* accepted_lengths, void* stream);
/** The same with prefix-cache tracks (kda::CommitTrack): track_slots, track_steps [B] int32 on
 * the backend's device (-1 = no track). A track slot must be allocated when this is called (a
 * captured commit: at the kda_prepare before the replay) and outside the batch; an invalid track
 * writes nothing and kda_check_device_errors reports it. */
int kda_commit_tracked(kda_backend* backend, const DLTensor* accepted_lengths,
                       const DLTensor* track_slots, const DLTensor* track_steps, void* stream);

/** Commits a tree round (kda_prepare_shaped with parents; KdaAttentionBackend::commit_tree):
 * request i's accepted path is accepted_paths[i][0..n), node indices root first, n =
 * accepted_lengths[i]; accepted_lengths [B] and accepted_paths [B, T] int32 on the backend's
 * device, contiguous. A path that is not a root path of the request's tree, or a length outside
 * [1, T], skips the request and raises the device error flag (kda_check_device_errors). */
int kda_commit_tree(kda_backend* backend, const DLTensor* accepted_lengths,
                    const DLTensor* accepted_paths, void* stream);
/** The same with prefix-cache tracks (track step k is the path's node k). */
int kda_commit_tree_tracked(kda_backend* backend, const DLTensor* accepted_lengths,
                            const DLTensor* accepted_paths, const DLTensor* track_slots,
                            const DLTensor* track_steps, void* stream);

/** Deferred commit: folds the pending steps of slots[n] into every layer's state. */
int kda_materialize(kda_backend* backend, const int32_t* slots, int32_t n, void* stream);
/** Drops the current round (see KdaAttentionBackend::abort_round). */
int kda_abort_round(kda_backend* backend, void* stream);
/** A CUDA-graph replay verified every layer of the freshly prepared batch. */
int kda_record_graph_verify_round(kda_backend* backend);
/** Synchronises `stream` and reports (KDA_ERROR_INVALID_ARGUMENT) a commit since the last check
 * that saw an accepted length outside [1, T] or an invalid track; clears the flag. */
int kda_check_device_errors(kda_backend* backend, void* stream);

/** Fills *info. */
int kda_backend_info_get(const kda_backend* backend, kda_backend_info* info);
/** The round state, e.g. "verify round, 1 of 2 layers verified (0)", in *state: owned by the
 * backend, valid until the next call on it. */
int kda_round_state(kda_backend* backend, const char** state);

/** Fills *out with the bytes of the backend's memory per part. */
int kda_memory_report_get(const kda_backend* backend, kda_memory_report* out);

/* ---- functional ops (kda::ops, backend/ops.h): verify, commit and materialize on tensors the
 * caller owns, no backend object. The kernel set is the tensors' device's (host or cuda:N, one
 * per device, made on first use; calls for one device are serialised). Shapes come from the
 * tensors; every argument is validated before anything is enqueued (KDA_ERROR_INVALID_ARGUMENT
 * naming it, e.g. "ops.verify: state.ring_g: expected dtype f32, got bf16"; nothing changes). Index
 * values (slots, rows, lengths, parents) on CUDA are read on the device only: a bad one is
 * undefined (the host kernel set checks them). Enqueued on `stream`; graph-capturable. ---- */

/** Verifies one layer; `info` (may be NULL) gets the dispatcher's decision. */
int kda_op_verify(const kda_verify_op* op, void* stream, kda_dispatch_info* info);
/** Commits every layer of `op->state` (or, with ring_pending given, records the deferred counts);
 * `info` may be NULL. */
int kda_op_commit(const kda_commit_op* op, void* stream, kda_commit_info* info);
/** Folds the pending steps of slots ([n] int32) into every layer's state (deferred commit; a
 * state without ring_u is the lazy write-back's, whose folds compute u: the same bits). */
int kda_op_materialize(const kda_state_tensors* state, const DLTensor* slots, void* stream);

/** A view of the pool tensor `name` (kda_state_pool.h: "conv_state", "ssm_state",
 * "conv_window", "snapshots", "ring_rawv", "ring_rawk", "ring_g", "ring_beta", "ring_pending",
 * "ring_u" (deferred commit only), "ring_cursor", "qkv_act") of layer `layer`, or of all layers
 * ([layers, ...]) for layer = -1
 * ("ring_cursor" and "qkv_act" have no layer dim: layer must be -1). Fills *out: data, device,
 * dtype, ndim, shape and strides (arrays owned by the backend, valid until destroy),
 * byte_offset 0. The memory is the backend's, valid until destroy; reading it is for tests and
 * tools (materialize first with the deferred commit); writing it (e.g. loading a captured
 * state) is allowed outside a round and must be ordered with the backend's stream. */
int kda_pool_view(kda_backend* backend, const char* name, int layer, DLTensor* out);

#ifdef __cplusplus
}  // extern "C"
#endif
