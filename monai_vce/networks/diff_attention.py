"""Differential attention for pretrained timm Vision Transformers, with exact weight transfer.

:class:`DifferentialAttention` subclasses :class:`timm.layers.DiffAttention` and keeps the ``qkv`` / ``proj``
weights of ``timm.layers.Attention``. Reference: Ye et al., "Differential Transformer", arXiv 2410.05258.
"""

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, DiffAttention
from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
from torch.jit import Final

__all__ = [
    "ATTENTION_VARIANTS",
    "ATTENTION_IMPLEMENTATIONS",
    "DifferentialAttention",
    "lambda_init_for_depth",
    "resolve_lambda_init",
    "resolve_variant",
    "convert_to_diff_attention",
    "find_vit_blocks",
]

#: Accepted values of ``variant`` (see ``docs/design/networks.md``).
ATTENTION_VARIANTS: tuple[str, ...] = ("paper", "diff_transformer", "preserving", "authors")
#: Accepted values of ``attn_impl``.
ATTENTION_IMPLEMENTATIONS: tuple[str, ...] = ("auto", "sdpa", "explicit")

LambdaInit = str | float | Callable[[int], float]

# (lambda_init schedule, sub-norm) of each variant
_VARIANT_DEFAULTS: dict[str, tuple[LambdaInit, bool]] = {
    "paper": ("constant", False),
    "diff_transformer": ("depth", True),
    "preserving": (0.0, False),
    "authors": ("constant", False),
}
#: std of the normal draw of the lambda vectors: Ye et al.'s 0.1 (timm's), the authors' code 0.02
_LAMBDA_STD = {"authors": 0.02}


def resolve_variant(variant: str | None = None) -> str:
    """The attention variant ``variant``, checked; None is ``"diff_transformer"`` (the bundle's default recipe).

    Args:
        variant: one of :data:`ATTENTION_VARIANTS`, or None.

    Raises:
        ValueError: an unknown value.
    """
    variant = "diff_transformer" if variant is None else variant
    if variant not in ATTENTION_VARIANTS:
        raise ValueError(f"attention variant must be one of {ATTENTION_VARIANTS}, got {variant!r}")
    return variant


def lambda_init_for_depth(depth: int) -> float:
    """Ye et al.'s schedule ``0.8 - 0.6 exp(-0.3 depth)`` for a block at 0-based ``depth``."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def resolve_lambda_init(schedule: LambdaInit, depth: int) -> float:
    """Return ``lambda_init`` of the block at ``depth`` under ``schedule``.

    Args:
        schedule: ``"depth"`` (Ye et al.'s :func:`lambda_init_for_depth`), ``"constant"`` (0.8 in every block, the
            paper's),
            a number (that value in every block) or a callable ``depth -> float``.
        depth: 0-based index of the block in the network.

    Raises:
        ValueError: for an unknown schedule name or a value outside ``[0, 1)``.
    """
    if callable(schedule):
        value = float(schedule(depth))
    elif isinstance(schedule, str):
        if schedule == "depth":
            value = lambda_init_for_depth(depth)
        elif schedule == "constant":
            value = 0.8
        else:
            raise ValueError(
                f"unknown lambda_init schedule {schedule!r}; use 'depth', 'constant', a number or a callable"
            )
    else:
        value = float(schedule)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"lambda_init must lie in [0, 1) (the output is scaled by 1 - lambda_init), got {value}")
    return value


class DifferentialAttention(DiffAttention):
    """Differential attention in one of the variants of ``docs/design/networks.md`` (``"diff_transformer"`` by default).

    The module computes ``2 * num_heads`` softmax maps of ``head_dim = dim // (2 * num_heads)`` channels, i.e. a
    pretrained block with ``h`` heads converts to ``num_heads = h / 2``. Build it from a pretrained attention with
    :meth:`from_attention` (weights carried over) or directly (random weights).

    Args:
        dim: token width.
        num_heads: number of differential heads (half the number of single softmax maps).
        qkv_bias: whether the fused ``qkv`` projection has a bias.
        qk_norm: normalise queries and keys per head with ``norm_layer``.
        scale_norm: normalise the attention output with ``norm_layer`` before ``proj``.
        proj_bias: whether the output projection has a bias.
        attn_drop: dropout on the attention maps (training only).
        proj_drop: dropout after the output projection.
        norm_layer: normalisation layer for ``qk_norm`` / ``scale_norm`` (timm's ``RmsNorm`` when None).
        depth: 0-based block index, fed to the lambda_init schedule.
        variant: ``"paper"``, ``"diff_transformer"``, ``"preserving"`` or ``"authors"`` (the layout of the paper
            authors' code: ``proj(concat(A1 V1 - lambda A2 V2, A2 V2))`` over head groups ``0 .. h/2-1`` and
            ``h/2 .. h-1``; see ``docs/design/networks.md``).
        lambda_init: schedule of :func:`resolve_lambda_init`; None takes the variant's (``"constant"`` 0.8 for
            ``"paper"`` and ``"authors"``, ``"depth"`` for ``"diff_transformer"``); ignored by ``"preserving"``,
            where it is 0.
        sub_norm: RMS-normalise each differential head (``2 * head_dim`` channels) and scale by
            ``1 - lambda_init``; None takes the variant's (on for ``"diff_transformer"`` only). Never applied by
            ``"preserving"``; ``"authors"`` refuses True.
        attn_impl: ``"auto"`` (SDPA unless timm's fused-attention switch is off), ``"sdpa"`` or ``"explicit"`` (the
            reference path of :meth:`attention_maps`; see ``docs/design/networks.md``).
        device: device of the new parameters.
        dtype: dtype of the new parameters (the lambda vectors are always float32).
    """

    use_sub_norm: Final[bool]
    preserving: Final[bool]
    authors: Final[bool]

    def __init__(
        self,
        dim: int,
        num_heads: int = 4,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        depth: int = 0,
        variant: str | None = None,
        lambda_init: LambdaInit | None = None,
        sub_norm: bool | None = None,
        attn_impl: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        variant = resolve_variant(variant)
        default_lambda_init, default_sub_norm = _VARIANT_DEFAULTS[variant]
        if attn_impl not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attn_impl must be one of {ATTENTION_IMPLEMENTATIONS}, got {attn_impl!r}")
        if dim % (2 * num_heads):
            raise ValueError(f"dim ({dim}) must be divisible by 2 * num_heads ({2 * num_heads})")
        if variant == "authors" and sub_norm:
            raise ValueError("diff_attention.py: the 'authors' variant has no sub-norm; leave sub_norm None or False")
        super().__init__(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            scale_norm=scale_norm,
            proj_bias=proj_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
            depth=depth,
            dual_lambda=False,
            device=device,
            dtype=dtype,
        )
        self.variant = variant
        self.preserving = variant == "preserving"
        self.authors = variant == "authors"
        if self.authors:
            # one (1, head_dim) vector per differential head, as in the authors' code (timm's: one shared vector)
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                shape = (num_heads, 1, self.head_dim)
                setattr(self, name, nn.Parameter(torch.empty(shape, dtype=torch.float32, device=device)))
        self.attn_impl = attn_impl
        self.depth = depth
        self.lambda_init_schedule = default_lambda_init if lambda_init is None else lambda_init
        self.use_sub_norm = bool(default_sub_norm if sub_norm is None else sub_norm) and not self.preserving
        if not self.use_sub_norm:
            self.sub_norm = nn.Identity()  # type: ignore[assignment]  # timm declares an RmsNorm
        self.set_lambda_init(depth)
        self.reset_parameters()

    def set_lambda_init(self, depth: int) -> None:
        """Set ``lambda_init`` (and the output scale) of this block from the schedule; 0 for ``"preserving"``."""
        # timm's constructor calls this before the subclass attributes exist: fall back to Ye et al.'s formula
        if getattr(self, "preserving", False):
            self.lambda_init = 0.0
        else:
            self.lambda_init = resolve_lambda_init(getattr(self, "lambda_init_schedule", "depth"), depth)
        self.output_scale = 1.0 - self.lambda_init if getattr(self, "use_sub_norm", True) else 1.0

    def reset_parameters(self) -> None:
        """Draw the lambda vectors from N(0, 0.1) (``"authors"``: N(0, 0.02)); ``"preserving"``: the second pair
        copies the first (lambda = 0)."""
        super().reset_parameters()
        std = _LAMBDA_STD.get(getattr(self, "variant", ""))
        if std is not None:
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                nn.init.normal_(getattr(self, name), mean=0.0, std=std)
        if getattr(self, "preserving", False):
            with torch.no_grad():
                self.lambda_q2.copy_(self.lambda_q1)  # type: ignore[union-attr,arg-type]  # set by timm
                self.lambda_k2.copy_(self.lambda_k1)  # type: ignore[union-attr,arg-type]

    @classmethod
    def from_attention(
        cls,
        attn: nn.Module,
        depth: int = 0,
        variant: str | None = None,
        lambda_init: LambdaInit | None = None,
        sub_norm: bool | None = None,
        attn_impl: str = "auto",
    ) -> "DifferentialAttention":
        """Convert a ``timm.layers.Attention`` with an even number of heads, reusing its modules as they are.

        ``qkv``, ``proj``, ``q_norm``, ``k_norm``, ``norm`` and the dropouts are the very same module objects (no copy,
        no re-initialisation, ``requires_grad`` kept); only the lambda vectors and the sub-norm are new.

        Args:
            attn: the pretrained attention module.
            depth: 0-based block index (for the lambda_init schedule).
            variant: ``"paper"``, ``"diff_transformer"``, ``"preserving"`` or ``"authors"``.
            lambda_init: see :class:`DifferentialAttention`.
            sub_norm: see :class:`DifferentialAttention`.
            attn_impl: ``"auto"``, ``"sdpa"`` or ``"explicit"``.

        Raises:
            TypeError: when ``attn`` is not a plain ``timm.layers.Attention``.
            ValueError: for an odd number of heads, a gated attention or a head width that differs from dim / heads.
        """
        variant = resolve_variant(variant)
        if not isinstance(attn, Attention) or isinstance(attn, DiffAttention):
            raise TypeError(f"expected a timm.layers.Attention module, got {type(attn).__name__}")
        if attn.num_heads % 2:
            raise ValueError(f"differential attention pairs heads; this attention has an odd number ({attn.num_heads})")
        if getattr(attn, "gate", None) is not None:
            raise ValueError("gated timm attention (gated=True) is not supported")
        dim = attn.qkv.in_features
        if attn.qkv.out_features != 3 * dim or attn.proj.in_features != dim or attn.proj.out_features != dim:
            raise ValueError(
                f"expected qkv {dim}->{3 * dim} and proj {dim}->{dim}, got qkv {attn.qkv.in_features}->"
                f"{attn.qkv.out_features} and proj {attn.proj.in_features}->{attn.proj.out_features}"
            )
        weight = attn.qkv.weight
        new = cls(
            dim,
            num_heads=attn.num_heads // 2,
            qkv_bias=attn.qkv.bias is not None,
            proj_bias=attn.proj.bias is not None,
            attn_drop=attn.attn_drop.p,
            proj_drop=attn.proj_drop.p,
            depth=depth,
            variant=variant,
            lambda_init=lambda_init,
            sub_norm=sub_norm,
            attn_impl=attn_impl,
            device=weight.device,
            dtype=weight.dtype,
        )
        for name in ("qkv", "proj", "q_norm", "k_norm", "norm", "attn_drop", "proj_drop"):
            setattr(new, name, getattr(attn, name))
        new.fused_attn = attn.fused_attn  # type: ignore[misc]  # Final in timm; copied from the converted block
        new.train(attn.training)
        return new

    def lambda_value(self) -> torch.Tensor:
        """The current ``lambda`` (a float32 scalar tensor, differentiable)."""
        return self._compute_lambda()

    def _compute_lambda(self) -> torch.Tensor:
        """``exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init``; ``"authors"``: the mean over the differential heads of
        ``exp(min(lq1 . lk1, 5)) - exp(min(lq2 . lk2, 5)) + lambda_init``, each head with its own vectors."""
        # (timm types the vectors Optional: None with dual_lambda, never used here)
        prod1 = self.lambda_q1 * self.lambda_k1  # type: ignore[operator]
        prod2 = self.lambda_q2 * self.lambda_k2  # type: ignore[operator]
        if self.authors:  # each dot product clamped at 5 before the exponential, as in the authors' code
            dot1 = prod1.sum(dim=[-2, -1]).float().clamp(max=5.0)
            dot2 = prod2.sum(dim=[-2, -1]).float().clamp(max=5.0)
            return (torch.exp(dot1) - torch.exp(dot2) + self.lambda_init).mean()
        return torch.exp(prod1.sum(dim=-1).float()) - torch.exp(prod2.sum(dim=-1).float()) + self.lambda_init

    def extra_repr(self) -> str:
        return (
            f"variant={self.variant}, num_heads={self.num_heads}, head_dim={self.head_dim}, depth={self.depth}, "
            f"lambda_init={self.lambda_init:.4f}, sub_norm={self.use_sub_norm}, attn_impl={self.attn_impl}"
        )

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries and keys (B, 2 * num_heads, N, head_dim) of the single heads, their values, and the values of the
        differential heads (B, num_heads, N, 2 * head_dim); all views of the ``qkv`` output, no copy."""
        B, N, _ = x.shape
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x).reshape(B, N, 3, 2 * h, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        # single heads 2j and 2j+1 are adjacent in the channel order: their values side by side are one 2d slice
        v_pair = qkv.view(B, N, 3, h, 2 * d)[:, :, 2].transpose(1, 2)
        return self.q_norm(q), self.k_norm(k), v, v_pair

    def _use_sdpa(self) -> bool:
        if self.attn_impl == "auto":
            return self.fused_attn
        return self.attn_impl == "sdpa"

    def _sdpa_pairs(
        self, q: torch.Tensor, k: torch.Tensor, v_pair: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``A1 V_j`` and ``A2 V_j`` (each (B, num_heads, N, 2 * head_dim)) with one fused SDPA call.

        See ``docs/design/networks.md``: the pair's two query sets are stacked along the sequence, each zero-padded on the
        half of the other head, against the pair's concatenated keys and values, so that q, k and v share one width.
        """
        B, H, N, d = q.shape
        h = H // 2
        q = q.reshape(B, h, 2, N, d)
        q_rows = q.new_zeros([B, h, 2, N, 2 * d])
        q_rows[:, :, 0, :, :d].copy_(q[:, :, 0])
        q_rows[:, :, 1, :, d:].copy_(q[:, :, 1])
        k_pair = k.transpose(1, 2).reshape(B, N, h, 2 * d).transpose(1, 2)  # a view when k is one (no qk_norm)
        mask = attn_mask
        if is_causal:
            mask = torch.ones([N, N], dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            mask = self._stack_mask(mask, B, N)
        out = F.scaled_dot_product_attention(
            q_rows.view(B, h, 2 * N, 2 * d),
            k_pair,
            v_pair,
            attn_mask=mask,
            dropout_p=self.attn_drop.p if self.training else 0.0,
            scale=self.scale,
        ).view(B, h, 2, N, 2 * d)
        o1, o2 = out.unbind(2)
        return o1, o2

    def _stack_mask(self, mask: torch.Tensor, B: int, N: int) -> torch.Tensor:
        """A mask broadcastable to the (B, 2 * num_heads, N, N) single-head scores, laid out for the stacked rows."""
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        if mask.size(1) == 1:
            return torch.cat((mask, mask), dim=2)
        if mask.size(1) != 2 * self.num_heads:
            raise ValueError(
                f"attn_mask must broadcast to (B, {2 * self.num_heads}, {N}, {N}) (one map per single head), "
                f"got shape {list(mask.shape)}"
            )
        return mask.reshape(mask.size(0), self.num_heads, 2 * N, mask.size(-1))

    def _softmax_maps(
        self, q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor:
        """Softmax maps (B, 2 * num_heads, N, N) of the single heads, before dropout."""
        B, H, N, d = q.shape
        scores = torch.baddbmm(
            q.new_empty(1, 1, 1),
            q.reshape(B * H, N, d),
            k.reshape(B * H, N, d).transpose(1, 2),
            beta=0.0,
            alpha=self.scale,
        ).view(B, H, N, N)
        scores = maybe_add_mask(scores, resolve_self_attn_mask(N, scores, attn_mask, is_causal))
        return scores.softmax(dim=-1)

    def attention_maps(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the softmax maps, explicitly computed, without dropout, and the current ``lambda``.

        Args:
            x: tokens (B, N, dim), i.e. the input of this attention module (after the block's first norm).
            attn_mask: optional additive or boolean mask, as in :meth:`forward`.
            is_causal: causal masking, as in :meth:`forward`.

        Returns:
            ``(maps, lambda)``: ``maps`` of shape (B, num_heads, 2, N, N) where ``maps[:, j, 0]`` is A1 and
            ``maps[:, j, 1]`` is A2 of differential head ``j`` (the softmax maps of single heads ``2j`` and
            ``2j + 1``). For ``"preserving"`` single head ``2j`` subtracts ``maps[:, j, 1]`` and head ``2j + 1``
            subtracts ``maps[:, j, 0]``. For ``"authors"`` A1 and A2 of differential head ``j`` are the maps of
            single heads ``j`` and ``j + num_heads``.
        """
        B, N, _ = x.shape
        q, k, _, _ = self._qkv(x)
        maps = self._softmax_maps(q, k, attn_mask, is_causal)
        if self.authors:
            return maps.view(B, 2, self.num_heads, N, N).transpose(1, 2), self._compute_lambda()
        return maps.view(B, self.num_heads, 2, N, N), self._compute_lambda()

    def _authors_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor:
        """``concat(A1 V1 - lambda A2 V2, A2 V2)`` (B, N, dim) of the ``"authors"`` variant: every single head
        attends with its own value (one SDPA call, the pretrained attention), then group 2 is subtracted from group 1.
        """
        B, H, N, d = q.shape
        if attn_mask is not None and attn_mask.dim() >= 3 and attn_mask.size(-3) not in (1, H):
            raise ValueError(
                f"diff_attention.py: attn_mask must broadcast to (B, {H}, {N}, {N}) (one map per single head), "
                f"got shape {list(attn_mask.shape)}"
            )
        if self._use_sdpa():
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None if is_causal else attn_mask,
                dropout_p=self.attn_drop.p if self.training else 0.0,
                is_causal=is_causal,
                scale=self.scale,
            )
        else:
            out = self.attn_drop(self._softmax_maps(q, k, attn_mask, is_causal)) @ v
        out = out.transpose(1, 2)  # (B, N, H, d): the pretrained heads in their channel order
        neg_lam = -self._compute_lambda().to(out.dtype)
        group1, group2 = out[:, :, : H // 2], out[:, :, H // 2 :]
        return torch.cat((torch.addcmul(group1, group2, neg_lam), group2), dim=2).reshape(B, N, H * d)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dim
        q, k, v, v_pair = self._qkv(x)
        if self.authors:
            return self.proj_drop(self.proj(self.norm(self._authors_heads(q, k, v, attn_mask, is_causal))))
        neg_lam = -self._compute_lambda()
        if self._use_sdpa():
            o1, o2 = self._sdpa_pairs(q, k, v_pair, attn_mask, is_causal)  # A1 V_j and A2 V_j, (B, h, N, 2d)
            neg_lam = neg_lam.to(o1.dtype)
            if not self.preserving:
                x = torch.addcmul(o1, o2, neg_lam)
            else:
                # single head 2j: (A1 - lam A2) v_2j; single head 2j+1: (A2 - lam A1) v_2j+1
                x = torch.cat(
                    (
                        torch.addcmul(o1[..., :d], o2[..., :d], neg_lam),
                        torch.addcmul(o2[..., d:], o1[..., d:], neg_lam),
                    ),
                    dim=-1,
                )
        else:
            maps = self.attn_drop(self._softmax_maps(q, k, attn_mask, is_causal)).view(B, h, 2, N, N)
            a1, a2 = maps.unbind(2)
            neg_lam = neg_lam.to(maps.dtype)
            if not self.preserving:
                x = torch.addcmul(a1, a2, neg_lam) @ v_pair
            else:
                x = torch.cat(
                    (
                        torch.addcmul(a1, a2, neg_lam) @ v_pair[..., :d],
                        torch.addcmul(a2, a1, neg_lam) @ v_pair[..., d:],
                    ),
                    dim=-1,
                )
        # x: (B, h, N, 2d), the channels of single heads 2j and 2j+1 side by side
        if self.use_sub_norm:
            # RMS norm per differential head, the (1 - lambda_init) scale folded into the per-row factor: one
            # reduction pass and two elementwise passes over x; reduced in float32 at least (float64 stays float64)
            acc = torch.float64 if x.dtype == torch.float64 else torch.float32
            sq = torch.linalg.vector_norm(x, ord=2, dim=-1, keepdim=True, dtype=acc).square() / (2 * d)
            factor = (torch.rsqrt(sq + self.sub_norm.eps) * self.output_scale).to(x.dtype)
            x = (x * factor).mul_(self.sub_norm.weight.to(x.dtype))
        # (B, h, N, 2d) -> (B, N, C): channel order of the pretrained heads
        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.norm(x)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


def find_vit_blocks(model: nn.Module) -> nn.Sequential | nn.ModuleList:
    """Return the transformer blocks of a timm ViT, an open_clip ``TimmModel`` (``.trunk``) or a module holding one.

    Raises:
        ValueError: when no ``blocks`` container is found.
    """
    for candidate in (model, getattr(model, "trunk", None), getattr(getattr(model, "visual", None), "trunk", None)):
        blocks = getattr(candidate, "blocks", None) if candidate is not None else None
        if isinstance(blocks, (nn.Sequential, nn.ModuleList)):
            return blocks
    raise ValueError(
        f"{type(model).__name__} has no ViT blocks: expected a timm VisionTransformer, an open_clip TimmModel "
        "(.trunk.blocks) or a module with .visual.trunk.blocks"
    )


def convert_to_diff_attention(
    model: nn.Module,
    variant: str | None = None,
    blocks: Sequence[int] | None = None,
    lambda_init: LambdaInit | None = None,
    sub_norm: bool | None = None,
    attn_impl: str = "auto",
) -> list[int]:
    """Replace, in place, the attention of ViT blocks by :class:`DifferentialAttention`, keeping the weights.

    Args:
        model: a timm ``VisionTransformer``, an open_clip ``TimmModel`` or a module with ``.visual.trunk``.
        variant: ``"paper"``, ``"diff_transformer"`` (default), ``"preserving"`` or ``"authors"`` (see
            ``docs/design/networks.md``).
        blocks: indices of the blocks to convert (negative indices count from the end); None converts all.
        lambda_init: lambda_init schedule (see :func:`resolve_lambda_init`; None: the variant's); the depth is the
            block index.
        sub_norm: per-head RMS norm and ``1 - lambda_init`` scale (None: the variant's).
        attn_impl: ``"auto"``, ``"sdpa"`` or ``"explicit"`` (see :class:`DifferentialAttention`).

    Returns:
        The sorted indices of the converted blocks.

    Raises:
        ValueError: for an index out of range, or a block that cannot be converted (the message names it).
        TypeError: when a block's attention is not a timm ``Attention`` (for instance already converted).
    """
    variant = resolve_variant(variant)
    vit_blocks = find_vit_blocks(model)
    n = len(vit_blocks)
    if blocks is None:
        indices = list(range(n))
    else:
        indices = []
        for i in blocks:
            i = int(i)
            if not -n <= i < n:
                raise ValueError(f"block index {i} out of range for a network with {n} blocks")
            indices.append(i % n)
        indices = sorted(set(indices))
    for i in indices:
        block = vit_blocks[i]
        attn = getattr(block, "attn", None)
        try:
            block.attn = DifferentialAttention.from_attention(
                attn,  # type: ignore[arg-type]  # None (a block without attention) raises TypeError below
                depth=i,
                variant=variant,
                lambda_init=lambda_init,
                sub_norm=sub_norm,
                attn_impl=attn_impl,
            )
        except (TypeError, ValueError) as err:
            raise type(err)(f"cannot convert the attention of block {i}: {err}") from err
    return indices
