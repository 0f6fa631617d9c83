"""Sample NVIDIA GPUs through NVML (pynvml, from nvidia-ml-py) and the host through psutil.

`NvmlSource` is the seam for tests: the benchmark loop only talks to that protocol, so a fake
source replaying recorded sequences exercises the same code as a real GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import psutil

MIB = 1024**2
GIB = 1024**3

# NVML "clocks event reasons" (formerly "throttle reasons") bit masks, from nvml.h.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clocks-event bit mask, in bit order."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


@dataclass
class GpuSample:
    """One reading of one GPU. A metric the device does not support is None."""

    index: int
    gpu_util: float | None = None
    mem_util: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)

    @property
    def mem_used_percent(self) -> float | None:
        """Memory used as a percentage of total, when both are known."""
        if self.mem_used_mb is None or not self.mem_total_mb:
            return None
        return 100.0 * self.mem_used_mb / self.mem_total_mb

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, including the derived memory percentage."""
        return {**asdict(self), "mem_used_percent": self.mem_used_percent}


@dataclass
class HostSample:
    """One reading of the host: CPU per core, RAM, and the watched process tree's CPU."""

    cpu_percent: list[float]
    ram_used_gb: float
    ram_total_gb: float
    ram_percent: float
    process_cpu_percent: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


class NvmlSource(Protocol):
    """What the benchmark needs from NVML. Real: `PynvmlSource`; tests: a fake."""

    def device_count(self) -> int: ...

    def driver_version(self) -> str: ...

    def name(self, index: int) -> str: ...

    def sample(self, index: int) -> GpuSample: ...

    def close(self) -> None: ...


class NoGpu(Exception):
    """No NVIDIA GPU can be sampled; the message says why."""


class GpuUnreadable(Exception):
    """NVML stopped answering for a GPU (lost from the bus, its driver in trouble): the
    message names the GPU and NVML's error."""


class PynvmlSource:
    """`NvmlSource` over the real pynvml. Construct with `open_nvml()`."""

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        self._handles: dict[int, Any] = {}
        # errors that leave one metric unknown: not supported, a query this driver lacks
        # (FunctionNotFound), no permission to read it; others (a GPU lost) are raised
        self._unreadable = tuple(
            getattr(pynvml, name)
            for name in (
                "NVMLError_NotSupported",
                "NVMLError_FunctionNotFound",
                "NVMLError_NoPermission",
            )
            if hasattr(pynvml, name)
        ) or (pynvml.NVMLError,)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def driver_version(self) -> str:
        return _text(self._nv.nvmlSystemGetDriverVersion())

    def name(self, index: int) -> str:
        return _text(self._nv.nvmlDeviceGetName(self._handle(index)))

    def _read(self, fn: Any, *args: Any) -> Any:
        """Call one NVML query; None when it gives nothing for this metric (one unreadable
        metric had ended the whole benchmark with a traceback)."""
        try:
            return fn(*args)
        except self._unreadable:
            return None

    def _clock_events(self, handle: Any) -> Any:
        """The clock event (throttle) reason mask: NVML's current query, else the older one
        it replaced (a driver or nvidia-ml-py from before the rename has only that)."""
        for name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            query = getattr(self._nv, name, None)
            if query is not None and (mask := self._read(query, handle)) is not None:
                return mask
        return None

    def sample(self, index: int) -> GpuSample:
        try:
            return self._sample(index)
        except self._nv.NVMLError as exc:
            raise GpuUnreadable(f"GPU {index}: NVML says {exc}") from None

    def _sample(self, index: int) -> GpuSample:
        nv, h = self._nv, self._handle(index)
        s = GpuSample(index=index)
        util = self._read(nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            s.gpu_util, s.mem_util = float(util.gpu), float(util.memory)
        mem = self._read(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            s.mem_used_mb, s.mem_total_mb = mem.used / MIB, mem.total / MIB
        temp = self._read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        s.temperature_c = None if temp is None else float(temp)
        power = self._read(nv.nvmlDeviceGetPowerUsage, h)
        s.power_w = None if power is None else power / 1000.0
        limit = self._read(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        s.power_limit_w = None if limit is None else limit / 1000.0
        clock = self._read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        s.sm_clock_mhz = None if clock is None else float(clock)
        mask = self._clock_events(h)
        s.throttle_reasons = [] if mask is None else decode_throttle_reasons(int(mask))
        return s

    def close(self) -> None:
        self._nv.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml() -> PynvmlSource:
    """Initialise NVML. Raises `NoGpu` with the reason when there is no usable NVIDIA GPU."""
    try:
        import pynvml
    except ImportError as exc:
        raise NoGpu(f"pynvml is not importable ({exc}); install nvidia-ml-py") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoGpu(f"NVML could not start: {exc}") from exc
    source = PynvmlSource(pynvml)
    if source.device_count() == 0:
        source.close()
        raise NoGpu("NVML found no devices")
    return source


class HostSampler:
    """psutil readings of CPU per core, RAM and (optionally) one process tree's total CPU.

    psutil's CPU percentages are "since the previous call", so one sampler is kept for the run.
    """

    def __init__(self, pid: int | None = None) -> None:
        self._pid = pid
        self._procs: dict[int, Any] = {}
        psutil.cpu_percent(percpu=True)
        self._tree_cpu()

    def _tree_cpu(self) -> float | None:
        if self._pid is None:
            return None
        ps = psutil
        try:
            root = ps.Process(self._pid)
            tree = [root, *root.children(recursive=True)]
        except ps.Error:
            return None
        total, alive = 0.0, {}
        for proc in tree:
            known = self._procs.get(proc.pid, proc)
            try:
                total += known.cpu_percent(interval=None)
                alive[proc.pid] = known
            except ps.Error:
                continue
        self._procs = alive
        return total

    def sample(self) -> HostSample:
        """One host reading (CPU since the previous call)."""
        ps = psutil
        vm = ps.virtual_memory()
        return HostSample(
            cpu_percent=[float(c) for c in ps.cpu_percent(percpu=True)],
            ram_used_gb=(vm.total - vm.available) / GIB,
            ram_total_gb=vm.total / GIB,
            ram_percent=float(vm.percent),
            process_cpu_percent=self._tree_cpu(),
        )
