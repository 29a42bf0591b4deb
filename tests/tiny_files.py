"""Small files in the formats researchers bring: a tiny BERT as save_pretrained writes it, a tiny ResNet's
state dict, an image folder of coloured PNGs."""


import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from torch import nn

WORDS = ("a an the and film movie good bad dull wonderful moving tiresome number probe sentence another longer one "
         ", .").split()


def write_tiny_bert(folder):
    """A 2-layer BERT (hidden 32) with a word-level tokenizer, as save_pretrained writes them."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *map(str, range(100))]
    (folder / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocabulary), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    BertTokenizerFast(str(folder / "vocab.txt")).save_pretrained(folder)
    return folder


def write_tiny_resnet(path):
    """timm's test_resnet (a deep stem, BatchNorm after every conv) with random BatchNorm statistics, so that
    folding them is not the identity; its state dict as a safetensors file, its classifier included."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=5)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({key: value.contiguous() for key, value in model.state_dict().items()}, path)
    return model.eval()


def write_image_folder(root, classes=("blue", "red"), per_class=12, split=False):
    """Class folders of small PNGs, coloured by class (so a model can learn them), optionally under train/, test/."""
    rng = np.random.default_rng(0)
    colours = {"blue": (30, 30, 200), "red": (200, 30, 30), "green": (30, 200, 30)}
    for part in (("train", "test") if split else ("",)):
        for name in classes:
            folder = root / part / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(per_class if part != "test" else per_class // 2):
                pixels = np.array(colours[name]) + rng.integers(-25, 25, (20, 26, 3))
                Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{index}.png")
    return root
