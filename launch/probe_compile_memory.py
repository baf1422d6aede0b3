"""Host memory taken by torch.compile's first compilation of ViT-B-32's towers at chunk 1,024
(no-grad forward, then forward + backward), with empty inductor and Triton caches: the machine's
memory in use above the start, and inductor's compile processes. On a GPU machine:

    PYTHONPATH=$PWD python3 launch/probe_compile_memory.py

Cited in docs/benchmarks.md (host memory of the 512k run): 2.2 GiB on one H200 machine, 16 cores.
"""
import os, tempfile, threading, time, json
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
import psutil, torch
import torch._inductor.config as cfg
from infcl_ds.models import create_model
from infcl_ds.engine.compile import compile_encoders
used = lambda: psutil.virtual_memory().total - psutil.virtual_memory().available
me = psutil.Process()
stat = {"peak_used": 0, "children": 0, "children_rss": 0}
done = threading.Event()
def sample(base):
    while not done.wait(0.2):
        stat["peak_used"] = max(stat["peak_used"], used() - base)
        kids = me.children(recursive=True)
        stat["children"] = max(stat["children"], len(kids))
        rss = 0
        for k in kids:
            try: rss += k.memory_info().rss
            except psutil.Error: pass
        stat["children_rss"] = max(stat["children_rss"], rss)
model = create_model("ViT-B-32").cuda().bfloat16()
x = torch.randn(1024, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
t = torch.randint(1, 49000, (1024, 77), device="cuda")
torch.cuda.synchronize(); base = used()
th = threading.Thread(target=sample, args=(base,), daemon=True); th.start()
t0 = time.time()
compile_encoders(model)
with torch.no_grad():
    model.encode_image(x); model.encode_text(t)
(model.encode_image(x).float().sum() + model.encode_text(t).float().sum()).backward()
torch.cuda.synchronize(); t1 = time.time(); time.sleep(2); done.set(); th.join()
after = used() - base
print(json.dumps({"compile_threads": cfg.compile_threads, "compile_s": t1 - t0, "peak_used_gib": stat["peak_used"] / 2**30,
                  "used_after_gib": after / 2**30, "max_children": stat["children"],
                  "children_rss_gib": stat["children_rss"] / 2**30, "cpus": os.cpu_count()}))
