"""hf:<org>/<name>[@revision] models through huggingface_hub, offline against a local mirror
of the Hub's cache layout (the user's cache and revision pinning), and the one-line errors."""

import numpy as np
import pytest
import tokenizers

from specjax import testing
from specjax.checkpoints import hf, hub, loader
from specjax.formats.tokenizer import Tokenizer

COMMIT = 'a' * 40
OLDER = 'b' * 40


def tiny_directory(path, seed):
  words = ['<s>', '</s>', '[UNK]', 'hello', 'world', *(f'w{i}' for i in range(59))]
  backend = tokenizers.Tokenizer(
    tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='[UNK]')
  )
  backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok = Tokenizer(backend, bos_id=0, eos_id=1, chat_template='{{ messages[0].content }}')
  cfg, params = testing.tiny_model(seed=seed, vocab_size=len(words))
  hf.export_hf(path, cfg, params, tokenizer=tok)
  return params


@pytest.fixture
def mirror(tmp_path, monkeypatch):
  """A Hub cache holding org/tiny at two commits (main and the tag v1), offline."""
  from huggingface_hub import constants

  cache = tmp_path / 'hub'
  repo = cache / 'models--org--tiny'
  params = {}
  for commit, seed in ((COMMIT, 1), (OLDER, 2)):
    params[commit] = tiny_directory(repo / 'snapshots' / commit, seed)
  (repo / 'refs').mkdir()
  (repo / 'refs' / 'main').write_text(COMMIT)
  (repo / 'refs' / 'v1').write_text(OLDER)
  monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(cache))
  monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
  return repo, params


def test_a_hub_model_loads_from_the_users_cache_at_the_pinned_revision(mirror):
  repo, params = mirror
  for spec, commit in [
    ('hf:org/tiny', COMMIT),
    ('hf:org/tiny@main', COMMIT),
    ('hf:org/tiny@v1', OLDER),
    (f'hf:org/tiny@{OLDER}', OLDER),
  ]:
    loader.check_model_spec(spec)
    model = loader.load_model(spec)
    assert model.source == spec
    np.testing.assert_array_equal(model.params['embed'], params[commit]['embed'])
    assert model.tokenizer.encode('hello world') == [3, 4]


def test_a_hub_gguf_file_is_fetched_as_one_file(mirror):
  repo, _ = mirror
  (repo / 'snapshots' / OLDER / 'model.gguf').write_bytes(b'GGUF stand-in')
  path = hub.fetch('hf:org/tiny/model.gguf@v1')
  assert open(path, 'rb').read() == b'GGUF stand-in'


@pytest.mark.parametrize(
  'spec, message',
  [
    (
      'hf:org/absent',
      'hf:org/absent: not in the Hugging Face cache, and the Hub cannot be reached',
    ),
    ('hf:org/tiny@v9', 'hf:org/tiny@v9: not in the Hugging Face cache'),
    ('hf:org/tiny/none.gguf', 'hf:org/tiny/none.gguf: not in the Hugging Face cache'),
  ],
)
def test_what_the_cache_lacks_is_one_line(mirror, spec, message):
  with pytest.raises(ValueError, match='^' + message.replace('.', r'\.')):
    loader.load_model(spec)


BAD_SPECS = [
  *('hf:', 'hf:org', 'hf:org/', 'hf:org/x@', 'hf:org/x/y.bin', 'hf:/x', 'hf:org/x/'),
  *('hf:org/x//a.gguf', 'hf:org/x@a@b', 'hf:a--b/x', 'hf:org/x..y', 'hf:org/x.git'),
]


@pytest.mark.parametrize('spec', BAD_SPECS)
def test_bad_hub_specs_are_refused_before_anything_loads(spec):
  with pytest.raises(ValueError, match='bad Hugging Face model'):
    loader.check_model_spec(spec)


def test_the_hubs_answers_are_one_line_each(monkeypatch):
  """What the Hub raises online (no network here): each error class mapped to its line."""
  import huggingface_hub
  from huggingface_hub import errors

  def raising(error):
    def fetch(*args, **kwargs):
      raise error

    return fetch

  response = type('R', (), {'status_code': 404, 'headers': {}, 'url': 'u', 'request': None})()
  cases = [
    (errors.GatedRepoError('gated', response=response), 'the repository is gated: accept'),
    (errors.RepositoryNotFoundError('no', response=response), 'no repository org/x on the'),
    (errors.RevisionNotFoundError('no', response=response), "org/x has no revision 'r'"),
  ]
  for error, message in cases:
    monkeypatch.setattr(huggingface_hub, 'snapshot_download', raising(error))
    with pytest.raises(ValueError, match=message):
      hub.fetch('hf:org/x@r')
  monkeypatch.setattr(
    huggingface_hub,
    'hf_hub_download',
    raising(errors.RemoteEntryNotFoundError('no', response=response)),
  )
  with pytest.raises(ValueError, match="org/x has no file 'a.gguf'"):
    hub.fetch('hf:org/x/a.gguf')
  monkeypatch.setattr(
    huggingface_hub,
    'snapshot_download',
    raising(errors.HfHubHTTPError('500 down\nmore', response=response)),
  )
  with pytest.raises(ValueError, match='^hf:org/x: the Hugging Face Hub answered 500 down$'):
    hub.fetch('hf:org/x')
