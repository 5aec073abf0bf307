# The process-level check run on the Intel Xeon: 12 updates of gpt-mini(layers=3,connection=PostLN) on fixed random
# batches, an evaluation forward after each, a digest of the weights and the evaluation's logits after every update.
# Usage: OMP_NUM_THREADS=2 PYTHONPATH=. python docs/results/determinism/xeon_steps.py 0|1   (1: threads fixed first)
import sys,hashlib,torch,torch.nn.functional as F
from skiplab.models import build_model,model_config
if sys.argv[1]=='1':torch.set_num_threads(torch.get_num_threads())
c=model_config('gpt-mini(layers=3,connection=PostLN)',vocab_size=257)
g=torch.Generator().manual_seed(0);torch.manual_seed(4);m=build_model(c);o=torch.optim.AdamW(m.parameters(),lr=1e-3,weight_decay=.1);ps=list(m.parameters());h=[]
for s in range(12):
  b=torch.randint(0,257,(8,257),generator=g);y=m(b[:,:-1]);o.zero_grad();F.cross_entropy(y.float().transpose(1,2),b[:,1:]).backward();torch.nn.utils.clip_grad_norm_(ps,1.);o.step()
  with torch.no_grad():e=m(torch.randint(0,257,(16,256),generator=g))
  h.append(hashlib.sha1(b''.join(t.detach().contiguous().view(torch.uint8).numpy().tobytes() for t in ps+[e])).hexdigest()[:6])
print(sys.argv[1],' '.join(h))
