"""Minimum necessary: the reveal permission for deferred work, and conversation codes
stored only as keyed hashes.

Existing token maps get ``code_hash`` = HMAC-SHA256 of their code under the key derived
from the configured ``PHI_HMAC_KEY`` (``Keyring.code_hash``), then the clear ``code``
column is dropped. Going back is possible only while there are no token maps: a hash
cannot give the code back.
"""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.exceptions import IrreversibleError


def hash_codes(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    TokenMap = apps.get_model("nexus_workflows", "TokenMap")
    alias = schema_editor.connection.alias
    rows = TokenMap.objects.using(alias).only("pk", "code")
    if not rows.exists():
        return  # nothing to convert: no keys needed
    # The keyring of the settings in force; raises PhiConfigurationError (naming the
    # setting, never a key) when the keys are missing or unusable.
    from nexus_workflows.phi.keys import build_keyring

    ring = build_keyring()
    for token_map in rows.iterator():
        TokenMap.objects.using(alias).filter(pk=token_map.pk).update(code_hash=ring.code_hash(token_map.code))


def refuse_with_maps(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    TokenMap = apps.get_model("nexus_workflows", "TokenMap")
    if TokenMap.objects.using(schema_editor.connection.alias).exists():
        # Named as `showmigrations` lists it (it was 0003 before a merge renumbered it).
        raise IrreversibleError(
            "cannot unapply nexus_workflows 0006_minimum_necessary while PHI token maps exist: "
            "their conversation codes are stored only as keyed hashes and cannot be restored"
        )


class Migration(migrations.Migration):

    dependencies = [
        ("nexus_workflows", "0005_runner_wakeup_mode"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="deferredwork",
            options={
                "permissions": [
                    ("revive_deferredwork", "Can revive abandoned work and run pending work now"),
                    ("reveal_deferredwork", "Can reveal triggers, checkpoints and error messages"),
                ],
                "verbose_name": "deferred work",
                "verbose_name_plural": "deferred work",
            },
        ),
        migrations.AddField(
            model_name="tokenmap",
            name="code_hash",
            field=models.CharField(max_length=64, null=True),
        ),
        migrations.RunPython(hash_codes, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name="tokenmap",
            name="code",
        ),
        migrations.AlterField(
            model_name="tokenmap",
            name="code_hash",
            field=models.CharField(max_length=64, unique=True),
        ),
        # Last, so that going back checks first, before any column changes.
        migrations.RunPython(migrations.RunPython.noop, refuse_with_maps),
    ]
