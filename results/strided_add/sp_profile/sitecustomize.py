# Loaded at interpreter start (PYTHONPATH=results/strided_add/sp_profile:...) in every rank of
# scripts/bench_sp_gather.py, which has no profile option: sets the default
# DeviceProfile.strided_write_factor to 1.0 (strided adds cost what contiguous ones do
# with the CuTe strided add), so packing=auto writes the add producers in place.
import inspect

import planner.cost as c

p = inspect.signature(c.DeviceProfile.__init__).parameters
n = [k for k in p if p[k].default is not inspect.Parameter.empty]
d = list(c.DeviceProfile.__init__.__defaults__)
d[n.index("strided_write_factor")] = 1.0
c.DeviceProfile.__init__.__defaults__ = tuple(d)
