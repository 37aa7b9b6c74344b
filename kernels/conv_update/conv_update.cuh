// conv_update.cuh: the unfused path's conv kernel and extend's conv-state roll.
//
// conv_update_kernel: grid (ceil(D/512), B), one thread per channel pair (bf16x2 loads and
//   stores; D is even because V is), all T tokens in order: conv + SiLU -> bf16
//   qkv_act[n*T+t][ch]; window after token t -> conv_window[rows[n]][t][0..2][ch]. Reads
//   conv_state, never writes it.
// conv_state_roll_kernel (extend, after the recurrence): conv_state_out[slot][j][ch] = last
//   W-1 raw inputs of concat(conv_state[slot], x[0:T]); each thread owns one (slot, ch), so
//   the in-place update reads everything before it writes. A track (ExtendParams) also gets
//   the window after its prompt token k in conv_state_out[track slot].
// conv_update_shaped_kernel: the same for a ragged or tree call (contract §8), one token at a
//   time: request n's tokens from row token_offsets[n], a tree node's window from its parent's.
// slot < 0: nothing read or written.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/launch_utils.h"
#include "kernels/params/kda_params.h"

namespace kda::kernels {

constexpr int kConvThreads = 256;

template <typename WeightT>
void launch_conv_update(const VerifyParams& p, cudaStream_t stream, bool pdl);
extern template void launch_conv_update<float>(const VerifyParams&, cudaStream_t, bool);
extern template void launch_conv_update<bf16_t>(const VerifyParams&, cudaStream_t, bool);

void launch_conv_state_roll(const ExtendParams& p, cudaStream_t stream, bool pdl);

}  // namespace kda::kernels
