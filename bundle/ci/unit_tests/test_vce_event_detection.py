# Copyright (c) monai-vce developers
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#     http://www.apache.org/licenses/LICENSE-2.0
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Model-zoo unit test of the ``vce_event_detection`` bundle, in the form of model-zoo's ``ci/unit_tests``.

Copy this file to model-zoo's ``ci/unit_tests/test_vce_event_detection.py`` and the distributable bundle
(``scripts/bundle_dist.py``) to ``models/vce_event_detection``; from model-zoo's root, run
``python ci/unit_tests/runner.py --b vce_event_detection``. As model-zoo's tests, it names the bundle by
``bundle_root`` relative to the working folder (model-zoo's root), and needs ``monai_vce`` installed
(``pip install --no-index --find-links models/vce_event_detection/wheels monai-vce``) and ``parameterized``
(model-zoo's requirements-dev.txt). monai-vce's own tests run it on the distributable bundle
(tests/bundle/test_model_zoo.py).

The inference runs on the CPU with the demo's tiny network (``configs/demo.json`` and ``configs/demo_metadata.json``
over ``inference.json`` and ``metadata.json``): the bundle ships no weights (``large_files.yml``), so the test makes a
randomly initialised weights file of that network, as model-zoo's ``verify_bundle.py`` makes fake weights, and the
BiomedCLIP-size network would be slow on a CPU runner. Two generated videos of 30 frames (32 px) are the data.
"""

import json
import os
import shutil
import tempfile
import unittest

import torch
from monai.bundle import ConfigParser, ConfigWorkflow
from parameterized import parameterized

# isort: split
# the bundle's package (first party for monai-vce's ruff, third party for model-zoo's isort): a block of its own
from monai_vce.data.synthetic import main as make_frames

TEST_CASE_1 = [  # inference with the demo's tiny network
    {
        "bundle_root": "models/vce_event_detection",
        "batch_size": 16,
        "num_workers": 0,
        "progress": False,
        "report": False,
    }
]

NUM_VIDEOS = 2


def _configs(bundle_root):
    """The config, metadata and logging files of the demo-sized inference."""
    configs = os.path.join(bundle_root, "configs")
    return {
        "config_file": [os.path.join(configs, "inference.json"), os.path.join(configs, "demo.json")],
        "meta_file": [os.path.join(configs, "metadata.json"), os.path.join(configs, "demo_metadata.json")],
        "logging_file": os.path.join(configs, "logging.conf"),
    }


def _produce_fake_weights(config_file, meta_file, bundle_root, output_file):
    """Save randomly initialised weights of the bundle's ``network_def`` (as verify_bundle.py's fake weights)."""
    parser = ConfigParser()
    parser.read_config(f=config_file)
    parser.read_meta(f=meta_file)
    parser["bundle_root"] = bundle_root
    torch.manual_seed(0)
    network = parser.get_parsed_content("network_def")
    torch.save(network.state_dict(), output_file)


class TestVCEEventDetection(unittest.TestCase):
    def setUp(self):
        self.work_dir = tempfile.mkdtemp()
        self.dataset_dir = os.path.join(self.work_dir, "data")
        self.ckpt_dir = os.path.join(self.work_dir, "models")
        self.output_dir = os.path.join(self.work_dir, "eval")
        os.makedirs(self.ckpt_dir)
        args = ["--out", self.dataset_dir, "--num-videos", str(NUM_VIDEOS), "--frames-per-video", "30"]
        status = make_frames([*args, "--size", "32", "--seed", "4"])
        self.assertEqual(status, 0)

    def tearDown(self):
        shutil.rmtree(self.work_dir)

    @parameterized.expand([TEST_CASE_1])
    def test_infer_config(self, override):
        override = dict(override)
        bundle_root = override["bundle_root"]
        files = _configs(bundle_root)
        _produce_fake_weights(
            files["config_file"], files["meta_file"], bundle_root, os.path.join(self.ckpt_dir, "model.pt")
        )
        override.update(
            dataset_dir=os.path.join(self.dataset_dir, "frames"), ckpt_dir=self.ckpt_dir, output_dir=self.output_dir
        )

        inferrer = ConfigWorkflow(workflow_type="infer", **files, **override)
        inferrer.initialize()
        check_result = inferrer.check_properties()
        if check_result is not None and len(check_result) > 0:
            raise ValueError(f"check properties for workflow failed: {check_result}")
        inferrer.run()
        inferrer.finalize()

        with open(os.path.join(self.output_dir, "events.json")) as f:
            events = json.load(f)
        videos = sorted(os.listdir(os.path.join(self.dataset_dir, "frames")))
        self.assertEqual(sorted(v["video_id"] for v in events["videos"]), videos)
        self.assertEqual(len(videos), NUM_VIDEOS)
        for video in events["videos"]:
            self.assertIsInstance(video["events"], list)
            for event in video["events"]:
                self.assertLessEqual(event["start"], event["end"])
                self.assertTrue(event["label"])
            self.assertTrue(os.path.isfile(os.path.join(self.output_dir, "probs", f"{video['video_id']}.npz")))


if __name__ == "__main__":
    unittest.main()
