# The in-process check run on the Intel Xeon: R repeats of S updates (forward, backward, clipping, AdamW) on fixed
# random batches, each component's result compared with the first repeat's; L busy processes beside it; FIX=1 fixes
# the thread count first; a fifth argument adds one product (512x2048 @ 2048x128) on 1 thread, on 2, and as started.
# Usage: OMP_NUM_THREADS=2 PYTHONPATH=. python docs/results/determinism/xeon_repeats.py S R L FIX [g]
import sys,os,hashlib,multiprocessing as M,torch,torch.nn.functional as F
from skiplab.models import build_model,model_config
a=sys.argv;S,R,L,fix=int(a[1]),int(a[2]),int(a[3]),a[4]=='1'
def spin():
  while 1:pass
P=[M.Process(target=spin,daemon=True) for _ in range(L)];[p.start() for p in P]
if fix:torch.set_num_threads(torch.get_num_threads())
c=model_config('gpt-mini(layers=3,connection=PostLN)',vocab_size=257)
g=torch.Generator().manual_seed(0);B=[torch.randint(0,257,(8,257),generator=g) for _ in range(S)]
def d(ts):
  h=hashlib.sha1()
  for t in ts:h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
  return h.hexdigest()[:10]
def rep():
  torch.manual_seed(4);m=build_model(c).train();o=torch.optim.AdamW(m.parameters(),lr=1e-3,weight_decay=.1);ps=list(m.parameters());T=[]
  for s,b in enumerate(B):
    y=m(b[:,:-1]);T.append((s,'fwd',d([y])));o.zero_grad()
    F.cross_entropy(y.float().transpose(1,2),b[:,1:]).backward();T.append((s,'bwd',d([p.grad for p in ps])))
    torch.nn.utils.clip_grad_norm_(ps,1.);T.append((s,'clip',d([p.grad for p in ps])));o.step();T.append((s,'step',d(ps)))
  return T
r=rep();n=0
for i in range(R-1):
  t=rep();f=next((x[:2] for x,z in zip(r,t) if x!=z),None);n+=f is not None;print(i,f,flush=True)
print('fix',fix,'load',L,n,'of',R-1,'differ; weights',r[-1][2],os.getloadavg()[0],flush=True)
if a[5:]:
  X=torch.randn(512,2048);Y=torch.randn(2048,128);d0=X@Y;torch.set_num_threads(1);d1=X@Y;torch.set_num_threads(2);d2=X@Y;print('gemm 1==2',torch.equal(d1,d2),'dyn==2',torch.equal(d0,d2))
