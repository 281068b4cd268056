"""Vectorised rendering of synthetic capsule endoscopy frames from per-frame label sets: mucosa, lumen, landmarks,
pathologies and unlabelled nuisances, sized relative to the image.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from monai_vce.labels import LABELS, NUM_LABELS, SECTIONS

__all__ = [
    "CAPSULES",
    "CapsuleDevice",
    "DEVICES",
    "UNSEEN_DEVICE",
    "capsule_device",
    "device_render_size",
    "FrameNuisances",
    "render_frames",
    "iter_render_video",
]

_Triple = tuple[float, float, float]


@dataclass(frozen=True)
class CapsuleDevice:
    """Appearance of one capsule system: what its camera and reading software do to a frame.

    Args:
        name: system name (key of :data:`DEVICES`).
        resolution: native image side in pixels; frames are rendered at ``size * resolution / 512`` pixels (never
            more than ``size``) and resized to ``size`` bilinearly, so a lower-resolution system shows less detail.
        colour_matrix: 3x3 sensor colour response applied to linear RGB (rows: output R, G, B).
        white_balance: RGB gains after the colour matrix (also the colour cast of the default appearance).
        vignetting: light fall-off at the image corners: brightness ``1 - vignetting * r**2 / 2`` at radius ``r``
            (``r`` = 1 at the middle of an edge).
        round_fov: round field of view, else a rounded square (corner radius 0.4).
        noise: scale of the per-frame sensor noise.
        chroma_noise: share (0-1) of the noise that is independent per colour channel, the rest luminance noise.
        jpeg_quality: quality (1-100) of the JPEG-like 8x8 block-DCT compression (YCbCr, 4:2:0), ``None`` for none.
        overlay: corner of the on-screen timestamp-like bar (``"tl"``, ``"tr"``, ``"bl"``, ``"br"``), ``None``
            for none.
        overlay_rgb: colour of the overlay bar.
        fps: frame rate of the system in frames per second (recorded in ``metadata.csv``).
    """

    name: str
    resolution: int
    colour_matrix: tuple[_Triple, _Triple, _Triple]
    white_balance: _Triple
    vignetting: float
    round_fov: bool
    noise: float
    chroma_noise: float
    jpeg_quality: int | None
    overlay: str | None
    overlay_rgb: _Triple
    fps: float


#: Capsule systems: the four of the Galar dataset (PillCam SB3/SB2/COLON2 512x512, Olympus 336x336) and NaviCam
#: (480x480), the system of the challenge test set, never seen in training. PillCams: round view, mild vignetting;
#: Olympus: rounded-square view, cooler and desaturated, softer (lower resolution), strongest compression;
#: NaviCam: warm yellow response, strong vignetting, coarse luminance noise, overlay in another corner.
DEVICES: dict[str, CapsuleDevice] = {
    d.name: d
    for d in (
        CapsuleDevice(
            name="PillCam SB3",
            resolution=512,
            colour_matrix=((1.10, -0.06, -0.04), (-0.04, 1.08, -0.04), (-0.02, -0.08, 1.10)),
            white_balance=(1.00, 0.97, 0.94),
            vignetting=0.25,
            round_fov=True,
            noise=0.8,
            chroma_noise=0.5,
            jpeg_quality=90,
            overlay="tl",
            overlay_rgb=(0.95, 0.95, 0.95),
            fps=4.0,
        ),
        CapsuleDevice(
            name="PillCam SB2",
            resolution=512,
            colour_matrix=((1.04, -0.02, -0.02), (-0.02, 1.04, -0.02), (-0.02, -0.04, 1.06)),
            white_balance=(1.02, 0.95, 0.90),
            vignetting=0.30,
            round_fov=True,
            noise=1.1,
            chroma_noise=0.6,
            jpeg_quality=80,
            overlay="tl",
            overlay_rgb=(0.95, 0.95, 0.95),
            fps=2.0,
        ),
        CapsuleDevice(
            name="PillCam COLON2",
            resolution=512,
            colour_matrix=((1.00, 0.00, 0.00), (0.00, 1.00, 0.00), (0.00, 0.00, 1.00)),
            white_balance=(0.98, 0.98, 0.98),
            vignetting=0.20,
            round_fov=True,
            noise=0.9,
            chroma_noise=0.5,
            jpeg_quality=85,
            overlay="tr",
            overlay_rgb=(0.95, 0.95, 0.95),
            fps=4.0,
        ),
        CapsuleDevice(
            name="Olympus",
            resolution=336,
            colour_matrix=((0.90, 0.07, 0.03), (0.05, 0.90, 0.05), (0.03, 0.07, 0.90)),
            white_balance=(1.00, 1.00, 1.04),
            vignetting=0.15,
            round_fov=False,
            noise=1.0,
            chroma_noise=0.7,
            jpeg_quality=70,
            overlay="br",
            overlay_rgb=(0.90, 0.95, 1.00),
            fps=2.0,
        ),
        CapsuleDevice(
            name="NaviCam",
            resolution=480,
            colour_matrix=((1.08, 0.00, -0.08), (0.02, 1.02, -0.04), (-0.04, -0.06, 0.90)),
            white_balance=(1.08, 1.02, 0.78),
            vignetting=0.55,
            round_fov=True,
            noise=1.4,
            chroma_noise=0.2,
            jpeg_quality=75,
            overlay="bl",
            overlay_rgb=(1.00, 0.90, 0.30),
            fps=2.0,
        ),
    )
}
#: The capsule system of the challenge test set, absent from training (a leave-one-device-out target).
UNSEEN_DEVICE = "NaviCam"
#: Capsule systems of the Galar dataset, each with a colour cast (RGB gains) and a round field of view or not: the
#: default appearance (colour cast and field of view only), picked at random per video.
CAPSULES: dict[str, tuple[tuple[float, float, float], bool]] = {
    name: (d.white_balance, d.round_fov) for name, d in DEVICES.items() if name != UNSEEN_DEVICE
}
# native resolution rendered at the full ``size``; lower ones are rendered smaller and resized up
_REFERENCE_RESOLUTION = 512


def capsule_device(name: str) -> CapsuleDevice:
    """The :class:`CapsuleDevice` called ``name``.

    Raises:
        ValueError: unknown name (the message names it and the known systems).
    """
    if name not in DEVICES:
        raise ValueError(f"unknown capsule system {name!r}; known: {', '.join(DEVICES)}")
    return DEVICES[name]


def device_render_size(device: CapsuleDevice, size: int) -> int:
    """Side in pixels at which ``device``'s frames of output side ``size`` are rendered before resizing."""
    return max(8, min(int(size), round(int(size) * device.resolution / _REFERENCE_RESOLUTION)))


_L = {name: i for i, name in enumerate(LABELS)}
# base colours (RGB in [0, 1]) of the sections, and of frames without section (out of body)
_SECTION_RGB = np.array(
    [
        [0.80, 0.52, 0.50],  # mouth
        [0.86, 0.70, 0.64],  # esophagus
        [0.80, 0.42, 0.32],  # stomach
        [0.85, 0.60, 0.34],  # small intestine
        [0.82, 0.69, 0.52],  # colon
        [0.32, 0.30, 0.29],  # no section
    ],
    dtype=np.float32,
)
# chunk size: frames rendered together so that the largest temporary stays near 16 M floats
_CHUNK_PIXELS = 2**20


class FrameNuisances:
    """Per-frame nuisance parameters of one video, drawn once for all its frames.

    Lumen position and view angle drift slowly; brightness varies smoothly with rare dark or
    over-exposed frames; lumen size, blur, sensor noise and colour jitter vary per frame; bubbles and debris come in
    episodes of consecutive frames.

    Args:
        n_frames: number of frames T of the video.
        rng: random generator (consumed).

    Attributes:
        bubbles: bool (T,): frames showing bubbles.
        dirt: bool (T,): frames showing greenish debris.
    """

    def __init__(self, n_frames: int, rng: np.random.Generator) -> None:
        t = n_frames
        self.centre = 0.35 * np.tanh(_smooth(rng, t, 2, width=12) * 1.8)  # lumen centre, slow walk
        self.lumen = rng.uniform(0.15, 0.4, t).astype(np.float32)
        self.angle = (rng.uniform(0, 2 * np.pi) + np.cumsum(rng.normal(0, 0.15, t))).astype(np.float32)
        gain = 1.0 + 0.12 * _smooth(rng, t, 1, width=20)[:, 0] + 0.05 * rng.normal(size=t)
        odd = rng.random(t)
        gain = np.where(odd < 0.04, rng.uniform(0.5, 0.7, t), np.where(odd > 0.97, rng.uniform(1.25, 1.4, t), gain))
        self.gain = gain.astype(np.float32)
        self.blur = rng.choice(3, size=t, p=[0.7, 0.2, 0.1])
        self.noise = rng.uniform(0.008, 0.045, t).astype(np.float32)
        self.jitter = rng.normal(0, 0.035, (t, 3)).astype(np.float32)
        # bubbles and debris come in episodes of consecutive frames, as in real videos
        self.bubbles = _smooth(rng, t, 1, width=8)[:, 0] > 1.0
        self.dirt = _smooth(rng, t, 1, width=10)[:, 0] > 0.8
        self.tex_pick = rng.integers(0, 1 << 30, (t, 3))


def _smooth(rng: np.random.Generator, n: int, dims: int, width: int) -> np.ndarray:
    """Gaussian-smoothed white noise (n, dims), rescaled to unit standard deviation."""
    pad = 3 * width
    x = rng.normal(size=(n + 2 * pad, dims))
    k = np.exp(-0.5 * (np.arange(-pad, pad + 1) / width) ** 2)
    k /= np.sqrt((k**2).sum())
    out = np.stack([np.convolve(x[:, d], k, mode="same")[pad : pad + n] for d in range(dims)], axis=1)
    return out.astype(np.float32)


def _periodic_noise(rng: np.random.Generator, n: int, size: int, cells: int) -> np.ndarray:
    """``n`` smooth periodic noise fields (n, size, size) with ``cells`` random values per side, std 1."""
    cells = max(2, int(cells))
    grid = rng.normal(size=(n, cells, cells)).astype(np.float32)
    x = np.arange(size) * cells / size
    i0 = np.floor(x).astype(int)
    t = x - i0
    t = t * t * (3 - 2 * t)  # smoothstep: no visible grid lines
    w = np.zeros((size, cells), dtype=np.float32)
    w[np.arange(size), i0 % cells] += 1 - t
    w[np.arange(size), (i0 + 1) % cells] += t
    out = np.einsum("sc,ncd,td->nst", w, grid, w)
    out -= out.mean(axis=(1, 2), keepdims=True)
    out /= out.std(axis=(1, 2), keepdims=True) + 1e-6
    return out


class _Banks:
    """Texture fields of one video, sampled per frame by random periodic shifts."""

    def __init__(self, rng: np.random.Generator, size: int) -> None:
        self.size = size
        self.lo = _periodic_noise(rng, 6, size, 4)
        self.mid = _periodic_noise(rng, 6, size, 8)
        self.hi = _periodic_noise(rng, 6, size, max(8, size // 3))

    def take(self, bank: np.ndarray, pick: np.ndarray) -> np.ndarray:
        """Fields for frames with random integers ``pick`` (B,): bank choice and shift from the integer."""
        s = self.size
        k = pick % len(bank)
        dy = (pick // 7) % s
        dx = (pick // (7 * s)) % s
        ar = np.arange(s)
        rows = (ar[None, :, None] + dy[:, None, None]) % s
        cols = (ar[None, None, :] + dx[:, None, None]) % s
        return bank[k[:, None, None], rows, cols]


def _soft_disc(d: np.ndarray, radius: np.ndarray, px: float) -> np.ndarray:
    """A disc of ``radius`` with an edge about one pixel (``px`` = pixel size) wide."""
    return np.clip((radius - d) / (1.5 * px) + 0.5, 0.0, 1.0)


def _spot_params(
    rng: np.random.Generator,
    n: int,
    count: tuple[int, int],
    size: tuple[float, float],
    spread: float = 0.75,
    cluster: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random spots for ``n`` frames: centres (n,K), radii (n,K) and presence (n,K), K = max count."""
    k = count[1]
    present = np.arange(k)[None, :] < rng.integers(count[0], count[1] + 1, n)[:, None]
    if cluster is None:
        cx = rng.uniform(-spread, spread, (n, k))
        cy = rng.uniform(-spread, spread, (n, k))
    else:  # spots grouped around one centre per frame
        c = rng.uniform(-spread, spread, (n, 2))
        cx = c[:, :1] + rng.normal(0, cluster, (n, k))
        cy = c[:, 1:] + rng.normal(0, cluster, (n, k))
    r = rng.uniform(size[0], size[1], (n, k))
    return cx.astype(np.float32), cy.astype(np.float32), r.astype(np.float32), present


def _u(rng: np.random.Generator, low: float, high: float, n: int) -> np.ndarray:
    """``n`` uniform float32 values shaped (n, 1, 1) to broadcast over images."""
    return rng.uniform(low, high, n).astype(np.float32)[:, None, None]


def _dist(xx: np.ndarray, yy: np.ndarray, cx: np.ndarray, cy: np.ndarray) -> np.ndarray:
    """Distances (n, K, S, S) from each pixel to each spot centre (n, K)."""
    return np.sqrt((xx - cx[..., None, None]) ** 2 + (yy - cy[..., None, None]) ** 2)


def _blend(img: np.ndarray, sel: np.ndarray, alpha: np.ndarray, colour) -> None:
    """``img[sel] = img[sel] * (1 - alpha) + colour * alpha`` with alpha (n, S, S) and colour RGB or (n,S,S,3)."""
    a = np.clip(alpha, 0.0, 1.0)[..., None]
    img[sel] = img[sel] * (1 - a) + np.asarray(colour, dtype=np.float32) * a


def _box_blur(x: np.ndarray, radius: int) -> np.ndarray:
    """Separable box blur of (n, S, S, 3) images with edge padding."""
    k = 2 * radius + 1
    for axis in (1, 2):
        pad = [(0, 0)] * 4
        pad[axis] = (radius + 1, radius)
        c = np.cumsum(np.pad(x, pad, mode="edge"), axis=axis, dtype=np.float32)
        n = x.shape[axis]
        x = (np.take(c, np.arange(k, k + n), axis=axis) - np.take(c, np.arange(0, n), axis=axis)) / k
    return x


def _bilinear_weights(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) bilinear interpolation weights, pixel centres aligned, edges clamped."""
    x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    i0 = np.minimum(np.floor(x).astype(int), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    t = (x - i0).astype(np.float32)
    w = np.zeros((n_out, n_in), dtype=np.float32)
    np.add.at(w, (np.arange(n_out), i0), 1 - t)
    np.add.at(w, (np.arange(n_out), i1), t)
    return w


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of (B, H, W, 3) images to (B, size, size, 3)."""
    if img.shape[1] == size and img.shape[2] == size:
        return img
    wy, wx = _bilinear_weights(size, img.shape[1]), _bilinear_weights(size, img.shape[2])
    return np.einsum("sh,bhwc,tw->bstc", wy, img, wx, optimize=True).astype(np.float32)


# JPEG (ITU T.81 Annex K) quantisation tables, luminance and chrominance
_JPEG_LUMA = np.array(
    [
        [16, 11, 10, 16, 24, 40, 51, 61],
        [12, 12, 14, 19, 26, 58, 60, 55],
        [14, 13, 16, 24, 40, 57, 69, 56],
        [14, 17, 22, 29, 51, 87, 80, 62],
        [18, 22, 37, 56, 68, 109, 103, 77],
        [24, 35, 55, 64, 81, 104, 113, 92],
        [49, 64, 78, 87, 103, 121, 120, 101],
        [72, 92, 95, 98, 112, 100, 103, 99],
    ],
    dtype=np.float32,
)
_JPEG_CHROMA = np.full((8, 8), 99, dtype=np.float32)
_JPEG_CHROMA[:4, :4] = [[17, 18, 24, 47], [18, 21, 26, 66], [24, 26, 56, 99], [47, 66, 99, 99]]
_RGB2YCC = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]], np.float32)
_YCC2RGB = np.linalg.inv(_RGB2YCC).astype(np.float32)
_k = np.arange(8)
_DCT = (
    np.sqrt(np.where(_k == 0, 1.0, 2.0) / 8)[:, None] * np.cos((2 * _k[None, :] + 1) * _k[:, None] * np.pi / 16)
).astype(np.float32)  # orthonormal DCT-II matrix


def _jpeg_like(img: np.ndarray, quality: int) -> np.ndarray:
    """JPEG-like compression of (B, H, W, 3) images in [0, 1]: YCbCr, 4:2:0 chroma, 8x8 DCT quantised (IJG scaling)."""
    b, h, w, _ = img.shape
    q = int(np.clip(quality, 1, 100))
    scale = 5000 / q if q < 50 else 200 - 2 * q
    tables = np.stack([_JPEG_LUMA, _JPEG_CHROMA, _JPEG_CHROMA], axis=-1)  # (8, 8, 3)
    tables = np.clip(np.floor((tables * scale + 50) / 100), 1, 255)
    hp, wp = -(-h // 16) * 16, -(-w // 16) * 16
    x = np.pad(img * 255.0, [(0, 0), (0, hp - h), (0, wp - w), (0, 0)], mode="edge") @ _RGB2YCC.T
    chroma = x[..., 1:].reshape(b, hp // 2, 2, wp // 2, 2, 2).mean(axis=(2, 4))
    x[..., 1:] = np.repeat(np.repeat(chroma, 2, axis=1), 2, axis=2)
    x[..., 0] -= 128.0
    blocks = x.reshape(b, hp // 8, 8, wp // 8, 8, 3)
    coef = np.einsum("ij,bpjqkc,lk->bpiqlc", _DCT, blocks, _DCT, optimize=True)
    t = tables[None, None, :, None, :, :]
    coef = np.round(coef / t) * t
    x = np.einsum("ij,bpiqlc,lk->bpjqkc", _DCT, coef, _DCT, optimize=True).reshape(b, hp, wp, 3)
    x[..., 0] += 128.0
    return np.clip((x @ _YCC2RGB.T)[:, :h, :w] / 255.0, 0.0, 1.0).astype(np.float32)


# cells of the overlay bar: a lead cell and bits of the frame number (a changing timestamp-like pattern)
_OVERLAY_BITS = 9


def _draw_overlay(img: np.ndarray, frames: np.ndarray, device: CapsuleDevice) -> None:
    """Draw ``device``'s timestamp-like bar into (B, S, S, 3) images in place: a dark box with bright cells."""
    if device.overlay is None:
        return
    s = img.shape[1]
    h, w, m = max(2, round(0.05 * s)), max(1, round(0.025 * s)), max(1, round(0.03 * s))
    n = _OVERLAY_BITS + 1
    top = m if device.overlay[0] == "t" else s - m - h
    left = m if device.overlay[1] == "l" else s - m - n * w
    bits = (np.asarray(frames)[:, None] >> np.arange(_OVERLAY_BITS)[None, :]) & 1
    on = np.concatenate([np.ones((len(frames), 1), bool), bits.astype(bool)], axis=1)  # (B, n)
    cell = np.repeat(on, w, axis=1)[:, None, :, None]  # (B, 1, n*w, 1)
    rgb = np.asarray(device.overlay_rgb, np.float32)
    img[:, top : top + h, left : left + n * w] = np.where(cell, rgb, np.float32(0.03))


def _fov_mask(xx: np.ndarray, yy: np.ndarray, px: float, round_fov: bool) -> np.ndarray:
    """Field-of-view mask (S, S): a disc of radius 1, or a rounded square (corner radius 0.4), edge about 2 px."""
    if round_fov:
        return np.clip((1.0 - np.sqrt(xx**2 + yy**2)) / (2 * px) + 1.0, 0, 1)
    outside = np.sqrt(np.clip(np.abs(xx) - 0.6, 0, None) ** 2 + np.clip(np.abs(yy) - 0.6, 0, None) ** 2) - 0.4
    return np.clip(0.5 - outside / (2 * px), 0, 1)


def _device_camera(
    img: np.ndarray,
    size: int,
    rng: np.random.Generator,
    nz: FrameNuisances,
    frames: np.ndarray,
    device: CapsuleDevice,
    xx: np.ndarray,
    yy: np.ndarray,
    px: float,
) -> np.ndarray:
    """A device's camera and software on rendered scenes (B, R, R, 3): uint8 (B, size, size, 3).

    Gain, colour matrix and white balance, blur, vignetting, sensor noise, field of view and JPEG-like compression
    at the render side R; then the bilinear resize to ``size`` and the on-screen overlay.
    """
    b = img.shape[0]
    matrix = np.asarray(device.colour_matrix, np.float32) * np.asarray(device.white_balance, np.float32)[:, None]
    img = (img @ matrix.T) * nz.gain[frames][:, None, None, None]
    for radius in (1, 2):
        sel = np.flatnonzero(nz.blur[frames] == radius)
        if sel.size:
            img[sel] = _box_blur(img[sel], radius)
    img *= np.clip(1.0 - 0.5 * device.vignetting * (xx**2 + yy**2), 0.0, 1.0)[None, ..., None]
    sigma = (nz.noise[frames] * device.noise)[:, None, None, None]
    c = float(np.clip(device.chroma_noise, 0.0, 1.0))
    lum = rng.standard_normal((b, *img.shape[1:3], 1), dtype=np.float32)
    col = rng.standard_normal(img.shape, dtype=np.float32)
    img += sigma * (np.float32(np.sqrt(1 - c)) * lum + np.float32(np.sqrt(c)) * col)
    img = np.clip(img * _fov_mask(xx, yy, px, device.round_fov)[None, ..., None], 0.0, 1.0)
    if device.jpeg_quality is not None:
        img = _jpeg_like(img, device.jpeg_quality)
    img = _resize(img, size)
    _draw_overlay(img, frames, device)
    return (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def render_frames(
    labels: np.ndarray,
    size: int,
    rng: np.random.Generator,
    nuisances: FrameNuisances,
    frames: np.ndarray,
    banks: _Banks,
    capsule: str | None = None,
    device: CapsuleDevice | None = None,
) -> np.ndarray:
    """Render a chunk of frames.

    Args:
        labels: bool (B, 17) label sets of the chunk, in :data:`LABELS` order.
        size: image side S in pixels.
        rng: random generator (consumed).
        nuisances: the video's :class:`FrameNuisances`.
        frames: int (B,) positions of the chunk's frames in the video (rows of ``nuisances``).
        banks: the video's texture banks, of side :func:`device_render_size` when ``device`` is given, else ``size``.
        capsule: capsule system of the default appearance (colour cast and field of view only); ``None`` for neutral.
        device: full appearance of a capsule system (see :class:`CapsuleDevice`), rendered at its native detail and
            resized to ``size``; excludes ``capsule``.

    Returns:
        uint8 (B, S, S, 3) images.
    """
    lab = np.asarray(labels, dtype=bool)
    if device is not None and capsule is not None:
        raise ValueError(f"give a capsule name or a device, not both (got {capsule!r} and {device.name!r})")
    b, s = lab.shape[0], int(size) if device is None else device_render_size(device, size)
    if banks.size != s:
        raise ValueError(f"texture banks of {banks.size} pixels for frames rendered at {s} pixels")
    px = 2.0 / s
    g = (np.arange(s, dtype=np.float32) + 0.5) * px - 1.0
    yy, xx = np.meshgrid(g, g, indexing="ij")
    nz = nuisances
    cx = nz.centre[frames, 0][:, None, None]
    cy = nz.centre[frames, 1][:, None, None]
    dx, dy = xx - cx, yy - cy
    d = np.sqrt(dx**2 + dy**2)  # (B, S, S) distance to the lumen centre
    phi = np.arctan2(dy, dx)
    ang = nz.angle[frames][:, None, None]
    pick = nz.tex_pick[frames]
    lo = banks.take(banks.lo, pick[:, 0])
    mid = banks.take(banks.mid, pick[:, 1])
    hi = banks.take(banks.hi, pick[:, 2])

    # --- mucosa: section colour and texture, weighted when a frame carries several sections
    sec = lab[:, : len(SECTIONS)].astype(np.float32)
    sec = np.concatenate([sec, (sec.sum(1, keepdims=True) == 0).astype(np.float32)], axis=1)
    sec /= sec.sum(1, keepdims=True)
    colour = sec @ _SECTION_RGB + nz.jitter[frames]  # (B, 3)
    u = xx * np.cos(ang) + yy * np.sin(ang)
    textures = (
        lambda i: 0.5 * lo[i] + 0.35 * np.clip(hi[i] - 1.3, 0, None),  # mouth: mottled, bright specks
        lambda i: 0.35 * np.sin(9 * phi[i] + 1.5 * lo[i]) + 0.15 * mid[i],  # esophagus: longitudinal folds
        lambda i: 0.45 * np.sin(2 * np.pi * 1.6 * u[i] + 2.2 * lo[i]) + 0.12 * hi[i],  # stomach: rugae
        lambda i: 0.38 * hi[i] + 0.15 * lo[i],  # small intestine: villous grain
        lambda i: 0.35 * np.sin(2 * np.pi * 2.2 * d[i] + 0.8 * lo[i]) + 0.12 * mid[i],  # colon: haustral rings
        lambda i: 0.3 * lo[i],  # out of body
    )
    tex = np.zeros((b, s, s), dtype=np.float32)
    for k, texture in enumerate(textures):
        i = np.flatnonzero(sec[:, k] > 0)  # only the frames showing this section
        if i.size:
            tex[i] += sec[i, k, None, None] * texture(i)
    img = colour[:, None, None, :] * (1.0 + 0.22 * tex[..., None])
    # thin vessels on colon mucosa
    w = sec[:, 4]
    if w.any():
        vessels = np.exp(-((mid / 0.07) ** 2)) * w[:, None, None] * 0.35
        img = img * (1 - vessels[..., None]) + np.array([0.62, 0.22, 0.22], np.float32) * vessels[..., None]

    # --- landmarks
    def sel_of(name: str) -> np.ndarray:
        return np.flatnonzero(lab[:, _L[name]])

    sel = sel_of("z-line")
    if sel.size:
        n = sel.size
        ph = _u(rng, 0, 2 * np.pi, n)
        radius = nz.lumen[frames[sel]][:, None, None] * 1.7 + _u(rng, 0.08, 0.25, n)
        rr = d[sel] * (1 + 0.2 * np.sin(7 * phi[sel] + ph))
        inner = np.clip((radius - rr) / (3 * px) + 0.5, 0, 1)[..., None]
        gastric, squamous = np.array([0.80, 0.34, 0.28], np.float32), np.array([0.92, 0.80, 0.76], np.float32)
        two_tone = inner * gastric + (1 - inner) * squamous
        two_tone = two_tone * (1 + 0.1 * lo[sel][..., None])
        alpha = _u(rng, 0.55, 0.9, n) * np.ones_like(rr)
        _blend(img, sel, alpha, two_tone)
        _blend(img, sel, 0.35 * np.exp(-(((rr - radius) / (2 * px)) ** 2)), (0.97, 0.93, 0.90))

    sel = sel_of("pylorus")
    if sel.size:
        n = sel.size
        pc = nz.centre[frames[sel]] + rng.normal(0, 0.12, (n, 2)).astype(np.float32)
        rad = _u(rng, 0.14, 0.26, n)
        alpha = _u(rng, 0.6, 0.95, n)
        qx, qy = xx - pc[:, 0, None, None], yy - pc[:, 1, None, None]
        d2 = np.sqrt(qx**2 + qy**2)
        # a thick pale muscular ring with radial folds converging on a dark round opening
        folds = 0.55 + 0.45 * np.sin(10 * np.arctan2(qy, qx) + 2 * lo[sel])
        _blend(img, sel, alpha * 0.6 * np.exp(-(((d2 - 1.9 * rad) / (0.35 * rad)) ** 2)), (0.35, 0.12, 0.10))
        ring = np.exp(-(((d2 - 1.2 * rad) / (0.55 * rad)) ** 2)) * folds
        _blend(img, sel, alpha * ring, (1.0, 0.74, 0.64))
        _blend(img, sel, alpha * np.clip((0.6 * rad - d2) / (3 * px) + 0.5, 0, 1), (0.05, 0.02, 0.02))

    sel = sel_of("ileocecal valve")
    if sel.size:
        n = sel.size
        vc = rng.uniform(-0.4, 0.4, (n, 2)).astype(np.float32)
        th = _u(rng, 0, np.pi, n)
        a = _u(rng, 0.28, 0.5, n)
        bb = a * _u(rng, 0.35, 0.55, n)
        qx, qy = xx - vc[:, 0, None, None], yy - vc[:, 1, None, None]
        pu = qx * np.cos(th) + qy * np.sin(th)
        pv = -qx * np.sin(th) + qy * np.cos(th)
        q = (pu / a) ** 2 + (pv / bb) ** 2
        mound = np.sqrt(np.clip(1 - q, 0, 1))
        shade = (1.0 + 0.35 * (-pv / bb)).clip(0.6, 1.4)[..., None]
        lip = np.array([0.93, 0.80, 0.52], np.float32) * shade
        _blend(img, sel, 0.85 * np.clip(mound * 3, 0, 1), lip)
        _blend(img, sel, 0.8 * np.exp(-((pv / (0.12 * bb + px)) ** 2)) * (q < 1), (0.18, 0.08, 0.05))

    # --- pathologies: (name, count, radius range, alpha range, colour)
    def spots(name, count, size, alpha_range, rgb, cluster=None, irregular=0.0):
        sel = sel_of(name)
        if not sel.size:
            return
        n = sel.size
        scx, scy, rad, present = _spot_params(rng, n, count, size, cluster=cluster)
        rad = np.maximum(rad, px)  # at least a pixel wide at low resolution
        dist = _dist(xx, yy, scx, scy)
        if irregular:
            dist = dist * (1 + irregular * lo[sel][:, None])
        m = (_soft_disc(dist, rad[..., None, None], px) * present[..., None, None]).max(axis=1)
        alpha = _u(rng, *alpha_range, n)
        _blend(img, sel, alpha * m, rgb)
        return sel, dist, rad, present, alpha

    spots("active bleeding", (1, 2), (0.12, 0.3), (0.65, 1.0), (0.86, 0.04, 0.04), irregular=0.35)
    sel = sel_of("blood")
    if sel.size:
        n = sel.size
        scx, scy, rad, present = _spot_params(rng, n, (1, 2), (0.3, 0.6))
        dist = _dist(xx, yy, scx, scy)
        m = (np.exp(-((dist / rad[..., None, None]) ** 2)) * present[..., None, None]).max(axis=1)
        _blend(img, sel, _u(rng, 0.45, 0.85, n) * m, (0.42, 0.03, 0.03))
        img[sel] *= np.array([1.0, 0.88, 0.88], np.float32)  # red haze of blood in the lumen
    out = spots("angiectasia", (1, 2), (0.025, 0.06), (0.7, 1.0), (0.92, 0.10, 0.16))
    if out is not None:  # halo of fine vessels around each spot
        sel, dist, rad, present, alpha = out
        halo = (np.exp(-dist / (2.5 * rad[..., None, None])) * present[..., None, None]).max(axis=1)
        _blend(img, sel, 0.35 * alpha * halo, (0.85, 0.25, 0.25))
    out = spots("erosion", (1, 3), (0.04, 0.09), (0.35, 0.7), (0.95, 0.90, 0.78), irregular=0.3)
    if out is not None:  # thin red rim
        sel, dist, rad, present, alpha = out
        outside = 1 - _soft_disc(dist, rad[..., None, None], px)  # the rim never covers the patch itself
        rim = np.exp(-(((dist - rad[..., None, None]) / (2 * px)) ** 2)) * outside
        rim = (rim * present[..., None, None]).max(axis=1)
        _blend(img, sel, 0.5 * alpha * rim, (0.80, 0.22, 0.20))
    sel = sel_of("erythema")
    if sel.size:
        n = sel.size
        scx, scy, rad, present = _spot_params(rng, n, (1, 2), (0.12, 0.28))
        dist = _dist(xx, yy, scx, scy) * (1 + 0.3 * mid[sel][:, None])
        m = (np.exp(-((dist / rad[..., None, None]) ** 2)) * present[..., None, None]).max(axis=1)
        _blend(img, sel, _u(rng, 0.25, 0.55, n) * m, (0.93, 0.25, 0.25))
    spots("hematin", (2, 5), (0.02, 0.08), (0.6, 0.95), (0.22, 0.11, 0.05), irregular=0.4)
    spots("lymphangioectasis", (6, 14), (0.025, 0.05), (0.6, 1.0), (0.98, 0.96, 0.88), cluster=0.15)
    sel = sel_of("polyp")
    if sel.size:
        n = sel.size
        scx, scy, rad, _ = _spot_params(rng, n, (1, 1), (0.08, 0.2))
        qx = (xx - scx[:, 0, None, None]) / rad[:, 0, None, None]
        qy = (yy - scy[:, 0, None, None]) / rad[:, 0, None, None]
        r2 = qx**2 + qy**2
        dome = np.sqrt(np.clip(1 - r2, 0, 1))
        light = _u(rng, 0, 2 * np.pi, n)
        shade = (0.8 + 0.45 * (-(qx * np.cos(light) + qy * np.sin(light))) * dome + 0.15 * dome)[..., None]
        body = np.array([0.88, 0.46, 0.38], np.float32) * shade
        alpha = _u(rng, 0.6, 1.0, n)
        _blend(img, sel, alpha * np.clip((1 - r2) * 4, 0, 1), body)
        _blend(img, sel, 0.45 * alpha * np.exp(-(((np.sqrt(r2) - 1) / 0.2) ** 2)), (0.25, 0.08, 0.06))
        hl = np.exp(-(((qx + 0.35 * np.cos(light)) ** 2 + (qy + 0.35 * np.sin(light)) ** 2) / 0.02))
        _blend(img, sel, 0.8 * hl, (1.0, 1.0, 1.0))
    out = spots("ulcer", (1, 2), (0.03, 0.07), (0.7, 1.0), (0.96, 0.93, 0.72))
    if out is not None:  # red inflamed ring around the fibrin centre
        sel, dist, rad, present, alpha = out
        outside = 1 - _soft_disc(dist, rad[..., None, None], px)  # the ring never covers the fibrin centre
        ring = (
            np.exp(-(((dist - 1.6 * rad[..., None, None]) / (0.5 * rad[..., None, None] + px)) ** 2))
            * outside
            * present[..., None, None]
        ).max(axis=1)
        _blend(img, sel, 0.8 * alpha * ring, (0.80, 0.15, 0.12))

    # --- lumen darkness and wall illumination
    lum = nz.lumen[frames][:, None, None]
    shade = (1 - 0.9 * np.exp(-((d / lum) ** 2))) * (0.7 + 0.3 * np.clip(d, 0, 1))
    img *= shade[..., None]

    # --- nuisances: specular highlights, debris, bubbles
    allf = np.arange(b)
    hcx, hcy, hr, hp = _spot_params(rng, b, (1, 4), (0.008, 0.025), spread=0.9)
    m = (_soft_disc(_dist(xx, yy, hcx, hcy), hr[..., None, None], px) * hp[..., None, None]).max(axis=1)
    _blend(img, allf, 0.9 * m, (1.0, 1.0, 0.98))
    sel = np.flatnonzero(nz.dirt[frames])
    if sel.size:
        scx, scy, rad, present = _spot_params(rng, sel.size, (3, 8), (0.015, 0.06))
        dist = _dist(xx, yy, scx, scy) * (1 + 0.4 * hi[sel][:, None])
        m = (_soft_disc(dist, rad[..., None, None], px) * present[..., None, None]).max(axis=1)
        _blend(img, sel, 0.8 * m, (0.45, 0.42, 0.16))
    sel = np.flatnonzero(nz.bubbles[frames])
    if sel.size:
        scx, scy, rad, present = _spot_params(rng, sel.size, (3, 10), (0.04, 0.15), spread=0.85)
        dist = _dist(xx, yy, scx, scy)
        rr = rad[..., None, None]
        p = present[..., None, None]
        rim = (np.exp(-(((dist - rr) / (0.12 * rr + px)) ** 2)) * p).max(axis=1)
        inside = (_soft_disc(dist, rr, px) * p).max(axis=1)
        glint = (
            np.exp(
                -(
                    ((xx - scx[..., None, None] + 0.4 * rr) ** 2 + (yy - scy[..., None, None] + 0.4 * rr) ** 2)
                    / (0.03 * rr**2 + px**2)
                )
            )
            * p
        ).max(axis=1)
        _blend(img, sel, 0.12 * inside + 0.55 * rim + 0.8 * glint, (0.97, 0.97, 0.95))

    if device is not None:
        return _device_camera(img, int(size), rng, nz, frames, device, xx, yy, px)
    # --- camera: gain, colour cast, blur, noise, field of view
    cast, round_fov = CAPSULES.get(capsule, ((1.0, 1.0, 1.0), False)) if capsule else ((1.0, 1.0, 1.0), False)
    img *= nz.gain[frames][:, None, None, None] * np.asarray(cast, np.float32)
    for radius in (1, 2):
        sel = np.flatnonzero(nz.blur[frames] == radius)
        if sel.size:
            img[sel] = _box_blur(img[sel], radius)
    img += rng.standard_normal(img.shape, dtype=np.float32) * nz.noise[frames][:, None, None, None]
    img *= _fov_mask(xx, yy, px, round_fov)[None, ..., None]
    return (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def iter_render_video(
    labels: np.ndarray,
    size: int,
    rng: np.random.Generator,
    capsule: str | None = None,
    nuisances: FrameNuisances | None = None,
    device: CapsuleDevice | str | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """Render all frames of a video chunk by chunk.

    Args:
        labels: bool (T, 17) label set of every frame.
        size: image side in pixels.
        rng: random generator of the video (consumed; same generator state -> same images).
        capsule: capsule system of the video for the default appearance (see :data:`CAPSULES`).
        nuisances: per-frame nuisances; drawn from ``rng`` when ``None``.
        device: full appearance of a capsule system instead (a :class:`CapsuleDevice` or a name in
            :data:`DEVICES`); excludes ``capsule``.

    Yields:
        ``(first_frame, images)`` with images uint8 (B, S, S, 3) of frames ``first_frame .. first_frame+B-1``.
    """
    labels = np.asarray(labels, dtype=bool)
    if labels.ndim != 2 or labels.shape[1] != NUM_LABELS:
        raise ValueError(f"labels must be (T, {NUM_LABELS}), got {labels.shape}")
    if size < 8:
        raise ValueError(f"image size must be at least 8 pixels, got {size}")
    dev = capsule_device(device) if isinstance(device, str) else device
    if dev is not None and capsule is not None:
        raise ValueError(f"give a capsule name or a device, not both (got {capsule!r} and {dev.name!r})")
    t = labels.shape[0]
    nz = nuisances if nuisances is not None else FrameNuisances(t, rng)
    banks = _Banks(rng, size if dev is None else device_render_size(dev, size))
    chunk = max(1, min(t, _CHUNK_PIXELS // (size * size)))
    for start in range(0, t, chunk):
        frames = np.arange(start, min(t, start + chunk))
        yield start, render_frames(labels[frames], size, rng, nz, frames, banks, capsule, dev)
