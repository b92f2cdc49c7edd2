// Precompiled header of the engine's LibTorch translation units (and of the
// torch test binary, which reuses it): parsing <torch/torch.h> costs ~15 s per
// file on a 2-core machine, the precompiled form a fraction of that.
#pragma once

#include <torch/torch.h>
