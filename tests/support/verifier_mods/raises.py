from tests.support.verifier_mods._misbehave import make
from verifiers import synthetic

NAME, VERSION = "synthetic", "raises-1"
SELF_TEST = synthetic.SELF_TEST
score = make("raises")
