"""The order in which DeepSpeed's ZeRO-3 hooks fetch a decoder's modules in one micro-batch, built from its shape (what
memory/zero3.py replays; docs/ARCHITECTURE.md, "memory/").

Every module's forward pre-hook fetches (containers and parameterless modules too: each fetch is a chance to
prefetch), in pre-order, and its post-hook releases, in post-order (a container after its children); backward
likewise with the children reversed, skipping modules whose output takes no gradient (rotary embeddings). A
checkpointed layer (HF's non-reentrant checkpointing) recomputes its children's forward right after backward has
fetched the chain of last children that produced its output (layer, mlp, down_proj): before the innermost one's
backward, which needs the recomputed tensors; frozen parameters fetched by the recompute are held until that
module's backward is done (DeepSpeed's recompute attribution). DeepSpeed 0.19 makes the
sparse-MoE blocks of Mixtral, Qwen2-MoE and Qwen3-MoE ZeRO-3 leaves (leaf_module_config.py): one fetch gathers
the router and every expert under them; Qwen3.5-MoE's block is not in that list (the hybrid families here). The
orders were read from DeepSpeed's own coordinator (bench/zero3_gather_check.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from medgpt_ray.memory.shapes import ModelShape


@dataclass(eq=False)  # a module: compared by identity
class Node:
    params: tuple[int, ...] = ()  # its own parameters' ids (norms and biases left out: never partitioned)
    children: list[Node] = field(default_factory=list)
    leaf: bool = False  # a ZeRO-3 leaf: fetched whole, with everything under it
    grad: bool = True  # its output takes a gradient: it has a backward hook
    passes_last: bool = True  # its output is its last child's (backward reaches that child before any recompute)

    def tree(self) -> tuple[int, ...]:
        return self.params + tuple(p for c in self.children for p in c.tree())

    def chain(self) -> list[Node]:
        """The module and its last children down to a leaf: what backward reaches first."""
        deeper = self.children and self.passes_last and not self.leaf
        return [self] + (self.children[-1].chain() if deeper else [])


@dataclass(frozen=True)
class Step:
    own: tuple[int, ...]  # its own parameters
    tree: tuple[int, ...]  # everything under it (DeepSpeed's reuse-distance walk counts it after a leaf's release)
    leaf: bool

    @property
    def fetch(self) -> tuple[int, ...]:
        """What its hook gathers: a leaf's whole tree, else its own parameters."""
        return self.tree if self.leaf else self.own


class _Builder:
    def __init__(self, lora_rank: int) -> None:
        self.sizes: list[int] = []
        self.rank = lora_rank
        self.adapters: set[int] = set()

    def linear(self, *numels: int) -> Node:
        self.sizes.extend(numels)
        return Node(tuple(range(len(self.sizes) - len(numels), len(self.sizes))))

    def proj(self, fan_in: int, fan_out: int) -> Node:
        """A layer's projection; under LoRA PEFT's wrapper runs the base layer, dropout, lora_A and lora_B and adds
        their outputs (an adapter over a wide MLP, r x intermediate, is above the persistence threshold)."""
        base = self.linear(fan_in * fan_out)
        if not self.rank:
            return base
        lora_a, lora_b = self.linear(self.rank * fan_in), self.linear(fan_out * self.rank)
        self.adapters.update(lora_a.params + lora_b.params)
        # The wrapper reads lora_A's weight (its dtype) itself: DeepSpeed fetches it as the wrapper's own.
        return Node(lora_a.params, children=[base, Node(), lora_a, lora_b])

    def mlp(self, inter: int, h: int, fused: bool = False) -> Node:
        if fused:
            return Node(children=[self.proj(h, 2 * inter), Node(), self.proj(inter, h)])
        return Node(children=[self.proj(h, inter), Node(), self.proj(h, inter), self.proj(inter, h)])

    def mixer(self, shape: ModelShape, i: int) -> Node:
        h = shape.hidden
        if i in shape.linear_layers:
            k = shape.linear_key_heads * shape.linear_key_head_dim
            v, nv = shape.linear_value_heads * shape.linear_value_head_dim, shape.linear_value_heads
            return Node(children=[self.proj(h, 2 * k + v), self.proj(h, v), self.proj(h, nv), self.proj(h, nv),
                                  Node(), self.proj(v, h)])  # conv1d: called as a function
        norm = [Node()] if shape.qk_norm else []
        q = shape.q_dim * (2 if shape.q_gate else 1)
        return Node(children=[self.proj(h, q), *norm, self.proj(h, shape.kv_dim), *norm,
                              self.proj(h, shape.kv_dim), self.proj(shape.q_dim, h)])

    def moe(self, shape: ModelShape) -> Node:
        """A leaf block (Qwen2-/Qwen3-MoE) is fetched in its parameters' registration order (router, experts,
        shared expert, its gate); Qwen3.5-MoE's runs the shared expert first and mixes the outputs (a product:
        backward recomputes before reaching its children)."""
        h, e, mi, si = shape.hidden, shape.experts, shape.moe_intermediate, shape.shared_expert_intermediate
        leaf = not shape.linear_layers
        router, experts = self.linear(e * h), self.linear(e * 2 * mi * h, e * h * mi)
        experts.children = [Node()]  # its activation, run inside it
        if not si:
            return Node(children=[router, experts], leaf=leaf)
        shared = self.mlp(si, h)
        if leaf:
            return Node(children=[router, experts, shared, self.linear(h)], leaf=True)
        return Node(children=[shared, router, experts, self.linear(h)], passes_last=False)

    def layer(self, shape: ModelShape, i: int) -> Node:
        mlp = self.moe(shape) if i in shape.moe_layers else self.mlp(shape.intermediate, shape.hidden,
                                                                      shape.fused_gate_up)
        if shape.norms_per_layer == 4:  # GLM-4: norms after the attention and after the MLP too
            return Node(children=[Node(), self.mixer(shape, i), Node(), Node(), mlp, Node()])
        return Node(children=[Node(), self.mixer(shape, i), Node(), mlp])


@dataclass
class Trace:
    steps: list[Step]
    releases: list[list[int]]  # after each fetch step, the steps whose modules are then released, in order
    sizes: list[int]  # each parameter id's element count
    # A recompute's fetch step -> the backward step its frozen parameters are attributed to (held until released).
    owner: dict[int, int] = field(default_factory=dict)
    adapters: set[int] = field(default_factory=set)  # LoRA's trainable parameters (the rest is frozen under LoRA)


Event = tuple[str, Node, "Node | None"]  # ("F", module, the backward module a recompute is attributed to) | ("R", ..)


def _forward(node: Node, out: list[Event], owner: Node | None = None) -> None:
    out.append(("F", node, owner))
    for c in [] if node.leaf else node.children:
        _forward(c, out, owner)
    out.append(("R", node, None))


def _backward(node: Node, out: list[Event], recompute: dict[int, Node]) -> None:
    out.append(("F", node, None))
    if id(node) in recompute:  # the innermost of a checkpointed layer's chain: its layer's forward again
        for c in recompute[id(node)].children:
            _forward(c, out, node)
    for c in [] if node.leaf else reversed(node.children):
        if c.grad:
            _backward(c, out, recompute)
    out.append(("R", node, None))


def trace(shape: ModelShape, ckpt_layers: int, lm_head: bool, lora_rank: int = 0) -> Trace:
    """The fetch steps of one micro-batch. A tied LM head is the embedding's parameter; the first `ckpt_layers`
    layers recompute in backward (which ones barely moves the peak: a layer at a time is recomputed); `lora_rank`
    > 0: the layers' projections (not the router, experts or heads) are wrapped by PEFT with adapters of that
    rank."""
    b = _Builder(lora_rank)
    embed = b.linear(shape.embedding_params)
    layers = [b.layer(shape, i) for i in range(shape.layers)]
    head = (Node(embed.params) if shape.tied_embeddings else b.linear(shape.vocab * shape.hidden)) if lm_head \
        else Node()  # a sequence classifier's 1-wide score head: never partitioned
    root = Node(children=[Node(children=[embed, Node(grad=False), *layers, Node()]), head])
    if lora_rank:
        root = Node(children=[root])  # PeftModel around the causal LM
    events: list[Event] = []
    _forward(root, events)
    _backward(root, events, {id(layer.chain()[-1]): layer for layer in layers[:ckpt_layers]})
    steps: list[Step] = []
    releases: list[list[int]] = []
    owner: dict[int, int] = {}
    running: dict[int, list[int]] = {}  # a module -> the fetch steps of its calls not yet done (nested)
    for kind, node, attributed in events:
        if kind == "F":
            running.setdefault(id(node), []).append(len(steps))
            if attributed is not None:
                owner[len(steps)] = running[id(attributed)][-1]
            steps.append(Step(node.params, node.tree(), node.leaf))
            releases.append([])
        else:
            releases[-1].append(running[id(node)].pop())
    return Trace(steps, releases, b.sizes, owner, b.adapters)
