// demo_prefix_check.h: the prefix-cache check (--prefix-cache). Every state the primary run's
// prefix cache produced (prefix tracks, copies, decode tracks: demo_prefix.h) and every
// request's final committed state are compared, bitwise, with an independent recomputation: a
// fresh backend on the same device that extends each request's whole token history (its prompt,
// then each round's accepted tokens) from the zero state, one request at a time, in chunks that
// end exactly at the tracked positions; no copy_slot, no track, no verify, no commit.
//
// The equalities this relies on, and therefore tests:
//  * extend of a chunk, then of the next chunk == extend of both at once (the state between
//    chunks is the f32 SSM state and the raw bf16 conv inputs; the recurrence is per token);
//  * extend of tokens == verify + commit of the same tokens, and a commit track of step k ==
//    the commit of k+1 tokens (the same per-token arithmetic, contract §3; the demo's mode
//    check does not rely on it, its two runs both verify and commit);
//  * a request's inputs do not depend on its batch or on the chunking (demo_generate.h).
#pragma once

#include "tools/demo/demo_check.h"
#include "tools/demo/demo_driver.h"

namespace kda::demo {

/// Runs the recomputation for every request of `primary` (which has run, with
/// RunSpec::prefix enabled) and compares. Bitwise rule; details: one line per event kind.
CheckOutcome check_prefix_cache(const DemoRun& primary);

}  // namespace kda::demo
