"""What Tandem knows about hardware and runtimes, as data.

Instance figures are AWS's published specifications; prices are approximate on-demand USD per hour
in us-east-1, what a cluster is charged where its own `prices` do not say otherwise (deployments.cost.Prices).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: str  # "" for CPU-only
    gpus: int
    gpu_memory_gib: int  # per GPU
    vcpus: int
    memory_gib: int
    network_gbps: float
    efa_interfaces: int  # EFA interfaces it takes: one per network card (32 on p5.48xlarge)
    hourly_usd: float
    nvme_gb: int = 0  # local NVMe instance store, all disks together (GB as AWS publishes it)

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def gpu_product(self) -> str:
        """The GPU's name as NVML reports it on this instance type ("" for CPU-only): GPU_PRODUCTS."""
        return GPU_PRODUCTS.get(self.gpu, "")


@dataclass(frozen=True)
class GpuFigures:
    """A GPU's data-sheet figures: dense BF16 tensor TFLOPS, HBM GB/s, and the GB/s one GPU sends to a peer in one
    direction (NVLink where the instance has it, else PCIe 4.0 x16). The performance model scales measured
    profiles by them."""

    tflops: float
    hbm_gbs: float
    interconnect_gbs: float


GPUS: dict[str, GpuFigures] = {
    "A10G": GpuFigures(125, 600, 32), "L4": GpuFigures(121, 300, 32), "L40S": GpuFigures(362, 864, 32),
    "A100-40GB": GpuFigures(312, 1555, 300), "A100-80GB": GpuFigures(312, 2039, 300),
    "H100": GpuFigures(989, 3350, 450), "H200": GpuFigures(989, 4800, 450),
}

# Each GPU's product name as NVML (and so nvidia-smi, and Ray) reports it on the AWS instance types that carry it: Ray
# labels a node from it (deployments.placement.ray_accelerator_label), so it decides which bundles a node takes.
# Seen on those instances (nvidia-smi on the instance unless said otherwise):
# - A10G, g5: "Product Name : NVIDIA A10G" on g5.4xlarge (awslabs/amazon-eks-ami#1523).
# - L4, g6: "NVIDIA L4" (speaches-ai/speaches#438); a gr6f's fractional L4 reads "NVIDIA L4-12Q"
#   (awslabs/amazon-eks-ami#2443), same product.
# - L40S, g6e: "NVIDIA L40S" on g6e.xlarge (akash-network/provider-configs#95).
# - A100-40GB, p4d (AWS's only A100 40GB): 8 × "NVIDIA A100-SXM4-40GB" on Bottlerocket's EKS nvidia variant
#   (bottlerocket-os/bottlerocket-core-kit#834, bottlerocket-kernel-kit#424).
# - A100-80GB, p4de: "GPU 0: NVIDIA A100-SXM-80GB" in `nvidia-smi -L` on p4de.24xlarge under EKS
#   (awslabs/amazon-eks-ami#1097); not the A100-SXM4-80GB other hosts report.
# - H100, p5: "GPU 0: NVIDIA H100 80GB HBM3", 18 NVLinks each, on Bottlerocket (bottlerocket-os/bottlerocket#4418).
# - H200, p5e/p5en: the EKS AMI matches *"H200"* in `nvidia-smi -L` on p5e.48xlarge (awslabs/amazon-eks-ami#1985);
#   an 8 × H200 SXM (700 W) board reads "NVIDIA H200" (NVIDIA/cuda-samples#311).
GPU_PRODUCTS: dict[str, str] = {
    "A10G": "NVIDIA A10G", "L4": "NVIDIA L4", "L40S": "NVIDIA L40S",
    "A100-40GB": "NVIDIA A100-SXM4-40GB", "A100-80GB": "NVIDIA A100-SXM-80GB",
    "H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200",
}

_INSTANCES = [
    InstanceType("g5.xlarge", "A10G", 1, 24, 4, 16, 10, 0, 1.006, nvme_gb=250),
    InstanceType("g5.12xlarge", "A10G", 4, 24, 48, 192, 40, 0, 5.672, nvme_gb=3800),
    InstanceType("g5.48xlarge", "A10G", 8, 24, 192, 768, 100, 1, 16.288, nvme_gb=7600),
    InstanceType("g6.xlarge", "L4", 1, 24, 4, 16, 10, 0, 0.805, nvme_gb=250),
    InstanceType("g6.12xlarge", "L4", 4, 24, 48, 192, 40, 0, 4.602, nvme_gb=3760),
    InstanceType("g6.48xlarge", "L4", 8, 24, 192, 768, 100, 1, 13.350, nvme_gb=7520),
    InstanceType("g6e.xlarge", "L40S", 1, 48, 4, 32, 20, 0, 1.861, nvme_gb=250),
    InstanceType("g6e.12xlarge", "L40S", 4, 48, 48, 384, 100, 1, 10.493, nvme_gb=3800),
    InstanceType("g6e.48xlarge", "L40S", 8, 48, 192, 1536, 400, 4, 30.131, nvme_gb=7600),
    InstanceType("p4d.24xlarge", "A100-40GB", 8, 40, 96, 1152, 400, 4, 21.958, nvme_gb=8000),
    InstanceType("p4de.24xlarge", "A100-80GB", 8, 80, 96, 1152, 400, 4, 27.447, nvme_gb=8000),
    InstanceType("p5.48xlarge", "H100", 8, 80, 192, 2048, 3200, 32, 55.040, nvme_gb=30720),
    InstanceType("p5e.48xlarge", "H200", 8, 141, 192, 2048, 3200, 32, 63.296, nvme_gb=30720),
    InstanceType("p5en.48xlarge", "H200", 8, 141, 192, 2048, 3200, 16, 63.296, nvme_gb=30720),
    # The local target: a Ray cluster on CPUs (vLLM's CPU build), for trying Tandem and for CI.
    InstanceType("cpu", "", 0, 0, 2, 24, 0, 0, 0.0),
]
INSTANCE_TYPES: dict[str, InstanceType] = {i.name: i for i in _INSTANCES}


@dataclass(frozen=True)
class Runtime:
    """One supported combination of Ray, vLLM, NIXL, CUDA and Python, and the images that hold exactly those: they
    are coupled and move together. A RayService's `rayVersion` is `ray`, which must be the image's Ray."""

    key: str
    ray: str
    vllm: str
    nixl: str
    accelerator: str  # "gpu" or "cpu"
    kuberay_min: str  # the oldest KubeRay whose RayService CRD keeps every field Tandem sets (KUBERAY_FIELDS_SINCE)
    target_kinds: tuple[str, ...]
    python: str = ""  # CPython major.minor
    cuda: str = ""  # major.minor of the CUDA torch and NIXL's wheel are built for (nixl-cu<major>)
    # Ray's official Ray LLM image of exactly these versions, by tag: what Tandem's runtime image is built FROM, and
    # what a `kubernetes` cluster with no registered image runs where no KV moves over EFA (deployments/
    # runtime_images.py). It lacks libfabric (no libfabric.so.1), which NIXL's LIBFABRIC backend loads on EFA.
    base_image: str = ""
    # Tandem's runtime image (deploy/runtime/Dockerfile): base_image plus AWS's EFA installer (libfabric first on
    # LD_LIBRARY_PATH) and NIXL pinned by hash. Built and pushed by the team to its registry as
    # <registry>/<image_repository>:<key>, and registered per cluster by digest (cluster setting `runtime_images`).
    image_repository: str = ""
    efa_installer: str = ""  # the AWS EFA installer version the Dockerfile installs
    libfabric: str = ""  # the libfabric that installer ships (fi_info --version)
    # The engine's KV block size in tokens: NIXL moves whole blocks, so the planner rounds prompts up to it.
    # vLLM defaults to 16 on CUDA and to 128 on its CPU build (vllm/platforms/cpu.py, when none is given).
    kv_block_tokens: int = 16


RUNTIMES: dict[str, Runtime] = {
    r.key: r
    for r in [
        Runtime(
            "ray-2.60.0-vllm-0.29.0",
            ray="2.60.0",
            vllm="0.29.0",  # ray[llm]==2.60.0 pins vllm[audio]==0.29.0, nixl==1.3.2 and nixl-cu13==1.3.2
            nixl="1.3.2",
            accelerator="gpu",
            kuberay_min="1.5.1",
            target_kinds=("eks", "kubernetes", "ray"),
            python="3.12",
            # Ray builds its Ray LLM images for Python 3.12 on CUDA 13.0 only (ray-project/ray
            # docker/ray-llm/Dockerfile: "ray-llm supports Python 3.12 only", CUDA_CODE=cu130; published tags
            # <ray>-py312-cu130 since 2.58). Nodes need an NVIDIA driver of the 580 series or newer.
            cuda="13.0",
            base_image="rayproject/ray-llm:2.60.0-py312-cu130",
            image_repository="tandem-runtime",
            # aws-efa-installer 1.51.0 (2026-10-22) ships libfabric 2.7.0amzn2.0 (AWS's EFA release notes).
            efa_installer="1.51.0",
            libfabric="2.7.0amzn2.0",
        ),
        Runtime(
            "ray-2.60.0-vllm-cpu-0.32.0",
            ray="2.60.0",
            vllm="0.32.0",
            nixl="1.3.2",
            accelerator="cpu",
            kuberay_min="",
            target_kinds=("ray",),
            python="3.12",
            kv_block_tokens=128,
        ),
    ]
}

# RayService fields Tandem relies on that older KubeRay CRDs do not declare, so the API server drops them without an
# error: the first KubeRay release that keeps each (paths under `spec`, `[]` for every item of a list). Without
# `resources` the workers never advertise prefill_pool/decode_pool and Serve waits for ever; without `authOptions`
# Ray runs without a token.
KUBERAY_FIELDS_SINCE: dict[str, str] = {
    "rayClusterConfig.workerGroupSpecs[].resources": "1.5.0",
    "rayClusterConfig.authOptions": "1.5.1",
}

# Pairs seen to break, with why: a request naming one is refused with this reason.
KNOWN_BROKEN: dict[tuple[str, str], str] = {
    ("2.60.0", "0.32.0"): "Ray 2.60.0's LLM extra is built against vLLM 0.29.0's CUDA engine API; "
    "vLLM 0.32.0 on GPUs is only known to work with its CPU build (runtime ray-2.60.0-vllm-cpu-0.32.0).",
    ("2.59.0", "0.29.0"): "Ray 2.59 predates build_pd_openai_app's ingress_deployment_config, which "
    "prefill/decode deployments need.",
    # Reported upstream (issue links are the evidence).
    ("2.55.1", "0.22.1"): "ray[serve,llm] 2.55.1 imports vLLM module paths that moved around vLLM 0.20 "
    "(vllm.entrypoints.openai.speech_to_text), so `ray.serve.llm` fails to import (ray-project/ray#64006).",
    ("2.43.0", "0.7.3"): "vLLM 0.7.3 pins Ray 2.40.0, which has no ray.serve.llm; Ray Serve LLM on 2.43 needs "
    "vLLM 0.7.2 (ray-project/ray#50931).",
    ("2.44.0", "0.8.4"): "Ray 2.44 has a regression vLLM excludes (its requirements skip ray 2.44.*); vLLM "
    "0.8.3+ fails under it (vllm-project/vllm#16622).",
    ("2.44.1", "0.8.4"): "Ray 2.44 has a regression vLLM excludes (its requirements skip ray 2.44.*); vLLM "
    "0.8.3+ fails under it (vllm-project/vllm#16622).",
}


def runtime_choices_text() -> str:
    return "; ".join(f"{r.key} (Ray {r.ray}, vLLM {r.vllm}{', CPU' if r.accelerator == 'cpu' else ''})"
                     for r in RUNTIMES.values())
