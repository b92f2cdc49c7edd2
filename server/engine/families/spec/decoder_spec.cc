#include "server/engine/families/spec/decoder_spec.h"

#include <algorithm>
#include <string>

#include "server/common/field_checks.h"
#include "server/common/status_macros.h"
#include "server/engine/tasks/catalog.h"

namespace circuitlab::engine {

FamilyDefaults DecoderSpecFamily::DecoderTrainingDefaults() {
  FamilyDefaults d;
  d.optimizer = v1::OPTIMIZER_KIND_ADAMW;
  d.schedule = v1::LR_SCHEDULE_TRIANGLE;
  d.eval_size = 512;
  return d;
}

absl::Status DecoderSpecFamily::ResolveLatentCommon(v1::LatentTask* t,
                                                    std::initializer_list<std::pair<const char*, bool>> foreign,
                                                    const std::string& why) {
  const std::string p = "task.latent.";
  if (!t->has_diversity()) t->set_diversity(-1);
  if (!t->has_p_minor()) t->set_p_minor(0.1);
  if (!t->has_num_majors()) t->set_num_majors(3);
  if (!t->has_num_ood()) t->set_num_ood(32);
  CL_RETURN_IF_ERROR(CheckRange<int32_t>(p + "diversity", t->diversity(), -1, 12));
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "p_minor", t->p_minor(), 0.0, 1.0));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_majors", t->num_majors(), 2, 16));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_ood", t->num_ood(), 1, 1024));
  for (const auto& [name, set] : foreign) {
    if (set) return absl::InvalidArgumentError(p + name + " " + why + ", leave it unset");
  }
  return absl::OkStatus();
}

absl::Status DecoderSpecFamily::ResolveModel(v1::ExperimentSpec* spec) const {
  auto* m = spec->mutable_model()->mutable_decoder();
  const std::string p = "model.decoder.";
  const DecoderDefaults& d = decoder_defaults();
  if (!m->has_num_layers()) m->set_num_layers(2);
  if (!m->has_d_model()) m->set_d_model(48);
  if (!m->has_num_heads()) m->set_num_heads(2);
  if (!m->has_mlp_width()) m->set_mlp_width(4 * std::min<uint32_t>(m->d_model(), 2048));
  if (m->activation() == v1::ACTIVATION_UNSPECIFIED) m->set_activation(d.activation);
  if (!m->has_attention_bias()) m->set_attention_bias(d.attention_bias);
  if (!m->has_final_layernorm()) m->set_final_layernorm(d.final_layernorm);
  if (!m->has_init_std()) m->set_init_std(0.02);
  if (m->init() == v1::DECODER_INIT_UNSPECIFIED) m->set_init(v1::DECODER_INIT_NORMAL);
  if (!v1::DecoderInit_IsValid(m->init())) {
    return absl::InvalidArgumentError(p + "init is not a known value: " + std::to_string(m->init()));
  }
  if (!m->has_rope_base()) m->set_rope_base(10000.0);
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_layers", m->num_layers(), 1, 24));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "d_model", m->d_model(), 4, 1024));
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "num_heads", m->num_heads(), 1, 16));
  if (m->d_model() % (2 * m->num_heads()) != 0) {
    return absl::InvalidArgumentError(p +
                                      "d_model must be a multiple of 2 * num_heads (RoPE rotates pairs of a "
                                      "head's dimensions), got d_model " +
                                      std::to_string(m->d_model()) + " and num_heads " +
                                      std::to_string(m->num_heads()));
  }
  CL_RETURN_IF_ERROR(CheckRange<uint32_t>(p + "mlp_width", m->mlp_width(), 1, 8192));
  if (!v1::Activation_IsValid(m->activation())) {
    return absl::InvalidArgumentError(p + "activation is not a known value: " + std::to_string(m->activation()));
  }
  CL_RETURN_IF_ERROR(CheckRange<double>(p + "init_std", m->init_std(), 0.0, 1.0));
  return CheckRange<double>(p + "rope_base", m->rope_base(), 2.0, 1e7);
}

// A decoder has no IMIR coordinates to record.
absl::Status DecoderSpecFamily::ResolveCoordinateRecording(v1::ExperimentSpec* spec, bool given) const {
  auto* r = spec->mutable_recording();
  if (!given) r->set_coordinates_every(0);
  if (r->coordinates_every() != 0 || r->complete_coordinates()) {
    return absl::InvalidArgumentError(
        "recording.coordinates_every and complete_coordinates record IMIR "
        "coordinates; model.decoder has none (leave them unset or 0)");
  }
  return absl::OkStatus();
}

int64_t DecoderSpecFamily::ResidualWidth(const v1::ExperimentSpec& spec) const {
  return spec.model().decoder().d_model();
}

int64_t DecoderSpecFamily::NumHeads(const v1::ExperimentSpec& spec) const { return spec.model().decoder().num_heads(); }

int64_t DecoderSpecFamily::ParameterCount(const v1::ExperimentSpec& spec) const {
  const auto& m = spec.model().decoder();
  const int64_t d = m.d_model(), f = m.mlp_width();
  // Per block: two LayerNorms, q/k/v/o (and their biases), the MLP with biases.
  const int64_t block = 4 * d + 4 * d * d + (m.attention_bias() ? 4 * d : 0) + 2 * d * f + f + d;
  const int64_t final_ln = m.final_layernorm() ? 2 * d : 0;
  return InOutParameters(spec, d) + m.num_layers() * block + final_ln;
}

uint64_t DecoderSpecFamily::EstimateRunMemoryBytes(const v1::ExperimentSpec& spec) const {
  const TaskShape s = ShapeOf(spec);
  const auto& m = spec.model().decoder();
  const double t = static_cast<double>(s.seq_len), d = m.d_model(), f = m.mlp_width();
  // Per block and token: LN outputs, q/k/v/attention output, MLP hidden
  // before and after the activation; per head the T x T scores and softmax.
  auto per_block = [&](double batch) { return batch * t * (10.0 * d + 2.0 * f) + 2.0 * batch * m.num_heads() * t * t; };
  const double logits = 3.0 * t * static_cast<double>(s.vocab);
  const double batch = spec.training().batch_size();
  // Training keeps every block's activations and their gradients;
  // evaluation (no autograd) one block at a time, kLatentEvalChunk sequences.
  const double train = 2.0 * (m.num_layers() * per_block(batch) + batch * logits);
  const double eval = 2.0 * (per_block(kLatentEvalChunk) + kLatentEvalChunk * logits);
  const double params = static_cast<double>(ParameterCount(spec));
  return static_cast<uint64_t>(4.0 * (4.0 * params + train + eval) + EvalSetBytes(spec));
}

}  // namespace circuitlab::engine
