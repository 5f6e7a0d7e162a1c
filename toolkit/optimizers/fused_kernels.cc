// The SGD family's memory-bound kernels, fused (TensorFlow, CPU): momentum steps with coupled L2
// weight decay in one pass over memory, and the LARS/LBSGD trust ratio in one pass.
//
// TensorFlow's own ResourceApplyKerasMomentum and ResourceApplyMomentum take a gradient that
// already holds the decay term, so `g + wd * w` costs two more passes (a product and a sum,
// each a new tensor). These kernels read w, the slot and g once and write w and the slot once.
// They do the same float operations in the same order as the unfused ops (the build uses no
// -march, so the compiler cannot contract them into FMAs), which the tests check bit for bit.
//
//   CoupledKerasMomentum (Keras's negated velocity, what LARS and LBSGD keep):
//     d = g + wd * w;  a = m * a - lr * d;  w = w + a          (Nesterov: w = w + m * a - lr * d)
//   CoupledMomentum (PyTorch's buffer, what the toolkit's SGD keeps):
//     d = g + wd * w;  b = m * b + d;       w = w - lr * b     (Nesterov: w = w - lr * (d + m * b))
//
// Built by scripts/setup.sh into fused_kernels.so next to this file; loaded by kernels.py.

#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tensorflow {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

absl::Status ScalarHyperparameters(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle unused;
  for (int scalar : {2, 4, 5}) TF_RETURN_IF_ERROR(c->WithRank(c->input(scalar), 0, &unused));
  return absl::OkStatus();
}

#define REGISTER_COUPLED_OP(NAME)                \
  REGISTER_OP(NAME)                              \
      .Input("var: resource")                    \
      .Input("accum: resource")                  \
      .Input("lr: T")                            \
      .Input("grad: T")                          \
      .Input("weight_decay: T")                  \
      .Input("momentum: T")                      \
      .Attr("T: {float, double}")                \
      .Attr("use_nesterov: bool = false")        \
      .SetShapeFn(ScalarHyperparameters)

REGISTER_COUPLED_OP("CoupledKerasMomentum");
REGISTER_COUPLED_OP("CoupledMomentum");

// One element of each rule, written as the unfused ops compute it.
struct KerasForm {
  template <bool kNesterov, typename T>
  static void Step(T& w, T& a, T g, T lr, T wd, T m) {
    const T d = g + wd * w;
    a = a * m - d * lr;
    w += kNesterov ? a * m - d * lr : a;
  }
};

struct TorchForm {
  template <bool kNesterov, typename T>
  static void Step(T& w, T& b, T g, T lr, T wd, T m) {
    const T d = g + wd * w;
    b = b * m + d;
    w -= kNesterov ? d * lr + b * m * lr : b * lr;
  }
};

template <typename Form, typename T>
class CoupledMomentumOp : public OpKernel {
 public:
  explicit CoupledMomentumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_nesterov", &nesterov_));
  }

  void Compute(OpKernelContext* ctx) override {
    auto locks = MaybeLockVariableInputMutexesInOrder<CPUDevice, T>(ctx, true, false, {0, 1});
    Tensor var, accum;
    OP_REQUIRES_OK(ctx, GetInputTensorFromVariable<CPUDevice, T>(ctx, 0, true, false, &var));
    OP_REQUIRES_OK(ctx, GetInputTensorFromVariable<CPUDevice, T>(ctx, 1, true, false, &accum));
    const Tensor& grad = ctx->input(3);
    OP_REQUIRES(ctx, var.IsInitialized() && accum.IsInitialized(),
                errors::FailedPrecondition("variable or slot not initialized"));
    OP_REQUIRES(ctx, var.shape().IsSameSize(accum.shape()) && var.shape().IsSameSize(grad.shape()),
                errors::InvalidArgument("var, accum and grad must have one shape: ",
                                        var.shape().DebugString(), " ", accum.shape().DebugString(),
                                        " ", grad.shape().DebugString()));
    for (int scalar : {2, 4, 5}) {
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(scalar).shape()),
                  errors::InvalidArgument("input ", scalar, " must be a scalar"));
    }
    T* w = var.flat<T>().data();
    T* a = accum.flat<T>().data();
    const T* g = grad.flat<T>().data();
    const T lr = ctx->input(2).scalar<T>()();
    const T wd = ctx->input(4).scalar<T>()();
    const T m = ctx->input(5).scalar<T>()();
    // Per element: read w, a, g; write w, a; a handful of flops.
    const Eigen::TensorOpCost cost(3 * sizeof(T), 2 * sizeof(T), 6);
    auto run = [&](auto nesterov) {
      ctx->eigen_cpu_device().parallelFor(
          var.NumElements(), cost, [&](Eigen::Index begin, Eigen::Index end) {
            for (Eigen::Index i = begin; i < end; ++i) {
              Form::template Step<decltype(nesterov)::value>(w[i], a[i], g[i], lr, wd, m);
            }
          });
    };
    if (nesterov_) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  }

 private:
  bool nesterov_;
};

// The layer-wise trust ratio of LARS and LBSGD, from one parallel pass over a variable and its
// gradient (trust_ratio.py's layer_trust_ratio gives the rule and its unfused form):
//
//   ratio = coefficient * ||w|| / (||g||^p + wd * ||w||^p + eps)^(1/p)      p = power, 1 or 2
//   ratio = 1                           where unit_at_zero and ||w|| or ||g|| is not > 0
//   ratio = min(max(ratio, min_ratio), max_ratio)
//
// The tensors are cut into fixed chunks whose float sums of squares (Eigen's vectorised tree
// reduction, as in tf.nn.l2_loss) are added in order in double, so the result does not
// depend on the threads; the rest is computed in double.
REGISTER_OP("TrustRatio")
    .Input("var: T")
    .Input("grad: T")
    .Input("weight_decay: T")
    .Input("epsilon: T")
    .Input("coefficient: T")
    .Output("ratio: T")
    .Attr("T: {float, double}")
    .Attr("power: int = 1")
    .Attr("unit_at_zero: bool = false")
    .Attr("min_ratio: float = -inf")
    .Attr("max_ratio: float = inf")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(1), &unused));
      for (int scalar : {2, 3, 4}) TF_RETURN_IF_ERROR(c->WithRank(c->input(scalar), 0, &unused));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

template <typename T>
class TrustRatioOp : public OpKernel {
 public:
  explicit TrustRatioOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("power", &power_));
    OP_REQUIRES(ctx, power_ == 1 || power_ == 2,
                errors::InvalidArgument("power must be 1 or 2, got ", power_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("unit_at_zero", &unit_at_zero_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_ratio", &min_ratio_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_ratio", &max_ratio_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& w = ctx->input(0);
    const Tensor& g = ctx->input(1);
    OP_REQUIRES(ctx, w.shape().IsSameSize(g.shape()),
                errors::InvalidArgument("var and grad must have one shape: ",
                                        w.shape().DebugString(), " ", g.shape().DebugString()));
    double w_squared, g_squared;
    SumsOfSquares(ctx, w.flat<T>().data(), g.flat<T>().data(), w.NumElements(), &w_squared,
                  &g_squared);
    const double wd = ctx->input(2).scalar<T>()();
    const double eps = ctx->input(3).scalar<T>()();
    const double coefficient = ctx->input(4).scalar<T>()();
    const double w_norm = std::sqrt(w_squared), g_norm = std::sqrt(g_squared);
    double ratio = power_ == 1 ? w_norm / (g_norm + wd * w_norm + eps)
                               : w_norm / std::sqrt(g_squared + wd * w_squared + eps);
    ratio *= coefficient;
    if (unit_at_zero_ && !(w_norm > 0 && g_norm > 0)) ratio = 1;
    ratio = std::min(std::max(ratio, double{min_ratio_}), double{max_ratio_});
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<T>()() = static_cast<T>(ratio);
  }

 private:
  static void SumsOfSquares(OpKernelContext* ctx, const T* x, const T* y, Eigen::Index n,
                            double* x_total, double* y_total) {
    constexpr Eigen::Index kChunk = 1 << 15;
    const Eigen::Index chunks = (n + kChunk - 1) / kChunk;
    std::vector<T> x_sums(chunks), y_sums(chunks);
    auto sum_of_squares = [](const T* data, Eigen::Index size) {
      Eigen::Tensor<T, 0, Eigen::RowMajor> sum =
          Eigen::TensorMap<const Eigen::Tensor<T, 1, Eigen::RowMajor>>(data, size).square().sum();
      return sum();
    };
    const Eigen::TensorOpCost cost(2 * sizeof(T) * kChunk, 0, 4 * kChunk);
    ctx->eigen_cpu_device().parallelFor(chunks, cost, [&](Eigen::Index first, Eigen::Index last) {
      for (Eigen::Index c = first; c < last; ++c) {
        const Eigen::Index begin = c * kChunk, size = std::min(kChunk, n - begin);
        x_sums[c] = sum_of_squares(x + begin, size);
        y_sums[c] = sum_of_squares(y + begin, size);
      }
    });
    *x_total = 0;
    *y_total = 0;
    for (Eigen::Index c = 0; c < chunks; ++c) {
      *x_total += x_sums[c];
      *y_total += y_sums[c];
    }
  }

  int power_;
  bool unit_at_zero_;
  float min_ratio_, max_ratio_;
};

#define REGISTER_KERNELS(T)                                                                   \
  REGISTER_KERNEL_BUILDER(                                                                    \
      Name("CoupledKerasMomentum").Device(DEVICE_CPU).TypeConstraint<T>("T"),                 \
      CoupledMomentumOp<KerasForm, T>);                                                       \
  REGISTER_KERNEL_BUILDER(Name("CoupledMomentum").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
                          CoupledMomentumOp<TorchForm, T>);                                   \
  REGISTER_KERNEL_BUILDER(Name("TrustRatio").Device(DEVICE_CPU).TypeConstraint<T>("T"),      \
                          TrustRatioOp<T>);
REGISTER_KERNELS(float);
REGISTER_KERNELS(double);

}  // namespace
}  // namespace tensorflow
