import gc, statistics, time, torch, sys
from torch.utils._python_dispatch import TorchDispatchMode
from racefuzz.trace.recorder import Recorder
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.capture import recording
sef = torch._C._dynamo.eval_frame.set_eval_frame
class Floor(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls): return False
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        prior = sef(None)
        try: return func(*args, **(kwargs or {}))
        finally: sef(prior)
def ops_only(env, ops):
    a, b = env.stream("a"), env.stream("b")
    x = torch.zeros(1024); y = torch.zeros(1024)
    for _ in range(ops // 2):
        with env.use(a):
            x.add_(1)
        with env.use(b):
            y.add_(x)
def t(kind, n=15):
    out=[]
    for _ in range(n):
        gc.collect()
        rec = Recorder("cpu", snapshot_plan={}); env = TraceEnv(rec, "cpu")
        s=time.perf_counter()
        if kind=="plain": ops_only(env, 4000)
        elif kind=="floor":
            with Floor(): ops_only(env, 4000)
        else:
            with recording(rec): ops_only(env, 4000)
        out.append((time.perf_counter()-s)/4000*1e6)
    return round(min(out),2)
t("rec",2)
r = [{k: t(k) for k in ("plain","floor","rec")} for _ in range(3)]
print(r, "rec-floor min:", min(x["rec"]-x["floor"] for x in r))
